"""FP16 rules in one home: what a plan rounds and how weights convert; the mixed-precision writer."""

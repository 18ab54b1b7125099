"""The search: driver (loads a strategy plugin), oracle (plan -> verdict), journal (resumable record)."""

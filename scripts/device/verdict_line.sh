# Sourced by the device scripts that judge recorded sets with `verify --json`: `line FILE` prints one verify's
# verdict as "pass|FAIL <worst excess>", or "error" where the file is missing or unreadable.
line() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('pass' if d['passed'] else 'FAIL', max((o.get('excess') or float('inf')) for o in d['outputs'].values()))" "$1" 2>/dev/null || echo "error"
}

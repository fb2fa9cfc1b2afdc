"""Prefix every line of stdin with the seconds since a start time: `cmd 2>&1 | python3 stamp.py START`."""
import sys
import time

t0 = float(sys.argv[1])
for line in sys.stdin:
    sys.stdout.write(f"{time.time() - t0:8.2f} {line}")
    sys.stdout.flush()

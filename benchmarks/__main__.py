"""`python -m benchmarks`: the peers table (run.py)."""
from .run import main

main()

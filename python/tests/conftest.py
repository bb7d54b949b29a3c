"""Shared set-up of the Python tests: the helper modules of this folder
(contract.py, fakes.py) are importable from every test, including the GPU
tests' spawned ranks (they inherit sys.path)."""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

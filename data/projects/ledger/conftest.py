# Keeps the project root on sys.path so `pytest` (not only `python -m pytest`) finds the package.

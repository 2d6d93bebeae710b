"""The performance page and README's headline table, generated from the recorded engine runs.

    python -m bench.report          # writes docs/performance.md, README.md's results block, bench/data/README.md
    python -m bench.report --check  # writes nothing; exit 1 naming each file that differs from what it would write

Each run is a folder of bench/data holding an e2e.json (`python -m bench.e2e`) and a one-line README.md:
the date, the GPU, the command, and, where the image as it shipped ran under another arm name, that arm
(runs.README_LINE). A table cell shows the latest run that measured it.
"""

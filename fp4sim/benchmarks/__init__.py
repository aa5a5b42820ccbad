"""Benchmark suites behind ``python -m fp4sim bench``: one module per suite, ratios side by side."""

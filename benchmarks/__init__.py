"""difffn benchmarks: ``python -m benchmarks [NAME ...]`` (or ``make bench``).

Every benchmark measures its candidates and their baseline in the same run, interleaved, and
prints ratios (never absolute pass/fail timings: machines are shared and noisy).
"""

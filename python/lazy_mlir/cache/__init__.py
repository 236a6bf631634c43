"""Compiled groups kept across steps, graphs and processes.

``group_key`` names what a group computes (not where it came from),
``compile_cache`` keeps the lowered groups in memory and on disk
(``disk_cache``: checked, atomically written entries, bounded in size), and
``recompiles`` explains why a group missed and compiled again. May import:
lowering (to load an entry's code), codegen, observe, config.
"""

#!/usr/bin/env python3
"""Prints a label→stage map file's `[by_label]` table as one inline TOML table, for a `--set` of a route's
`steer.by_label` (bench/banking77/steer.sh, bench/steer/load_shift.sh).

usage: inline_map.py MAP.toml
"""
import sys
import tomllib

m = tomllib.load(open(sys.argv[1], "rb"))["by_label"]
print("{ " + ", ".join(f'"{k}" = "{v}"' for k, v in m.items()) + " }")

#!/usr/bin/env python3
"""Every dpcheck command line shown in README.md and docs/ must name a subcommand and options that the
binary has: each line of a ```sh block that runs dpcheck (build/dpcheck, mpirun ... dpcheck, a bare
dpcheck) is read with the shell's word rules, its subcommand (and bench's sub-subcommand) looked up, and
every --option it gives checked against that subcommand's --help. A renamed or removed option, or a
subcommand that is gone, fails here, so the docs cannot drift from the binary.

  ci/docs_commands.py DPCHECK_BINARY REPO_ROOT
"""
import glob
import os
import re
import shlex
import subprocess
import sys


def help_text(binary, words):
    r = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def commands(path):
    """(line number, words after 'dpcheck') for every dpcheck command in the file's sh blocks."""
    fence = None
    pending = ""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if stripped.startswith("```"):
                fence = None if fence is not None else stripped[3:].strip()
                pending = ""
                continue
            if fence not in ("sh", "bash", "shell"):
                continue
            text = pending + line.split(" #")[0].rstrip("\n")
            if text.rstrip().endswith("\\"):
                pending = text.rstrip()[:-1] + " "
                continue
            pending = ""
            try:
                words = shlex.split(text, comments=True)
            except ValueError as e:
                yield number, None, f"cannot be read as shell words: {e}"
                continue
            # Every dpcheck on the line (`dpcheck audit -- mpirun ... dpcheck train ...`), each up to a
            # lone `--`, after which another program's words begin.
            for i, w in enumerate(words):
                if os.path.basename(w) == "dpcheck":
                    rest = words[i + 1:]
                    yield number, rest[:rest.index("--")] if "--" in rest else rest, None


def main():
    binary, root = sys.argv[1], sys.argv[2]
    files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    top_rc, top = help_text(binary, [])
    subcommands = set(re.findall(r"^  (\w[\w-]*) {2,}", top.split("Subcommands:")[1], re.M)) if "Subcommands:" in top else set()
    cache = {}
    failures = checked = 0
    for path in files:
        rel = os.path.relpath(path, root)
        for number, words, error in commands(path):
            where = f"{rel}:{number}"
            if error:
                print(f"{where}: {error}")
                failures += 1
                continue
            if not words or words[0].startswith("-"):
                continue  # `dpcheck --help`, `dpcheck --version`
            sub = words[0]
            if sub not in subcommands:
                print(f"{where}: dpcheck has no subcommand '{sub}' (it has {', '.join(sorted(subcommands))})")
                failures += 1
                continue
            path_words = [sub]
            if sub == "bench" and len(words) > 1 and not words[1].startswith("-"):
                path_words.append(words[1])
            key = tuple(path_words)
            if key not in cache:
                cache[key] = help_text(binary, path_words)
            rc, text = cache[key]
            if rc != 0:
                print(f"{where}: dpcheck {' '.join(path_words)} --help exits {rc}: {text.strip().splitlines()[-1:]}")
                failures += 1
                continue
            known = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", text))
            for w in words[len(path_words):]:
                option = w.split("=", 1)[0]
                if option.startswith("--") and option not in known:
                    print(f"{where}: dpcheck {' '.join(path_words)} has no option {option}")
                    failures += 1
            checked += 1
    print(f"docs_commands: {checked} dpcheck command lines checked in {len(files)} files, {failures} problems")
    return 1 if failures or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Lists Rust functions longer than N lines (default 100), longest first.

Usage: scripts/long-functions.py [N] [DIR...]   (default: the workspace's crates)
Counts from the `fn` line to its closing brace; braces inside strings,
chars and comments are skipped, so the counts match what an editor shows.
"""
import os
import re
import sys

FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)")


def code_only(text):
    """The text with strings, chars and comments blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:i + 10]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = '"' + hashes
            j = text.find(end, i + 2 + len(hashes))
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4]) or text.startswith("'\\", i):
            m = re.match(r"'(\\[^']*|[^\\'])'", text[i:])
            j = i + (len(m.group(0)) if m else 1)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    lines = code_only(open(path, encoding="utf-8").read()).split("\n")
    for start, line in enumerate(lines):
        match = FN.match(line)
        if not match:
            continue
        depth, opened = 0, False
        for end in range(start, len(lines)):
            for c in lines[end]:
                if c == "{":
                    depth, opened = depth + 1, True
                elif c == "}":
                    depth -= 1
                elif c == ";" and not opened and depth == 0:
                    break  # a declaration without a body
            else:
                if opened and depth == 0:
                    yield match.group(7), start + 1, end - start + 1
                    break
                continue
            break


def main():
    args = sys.argv[1:]
    limit = int(args.pop(0)) if args and args[0].isdigit() else 100
    roots = args or ["tracer-user/src", "tracer-common/src", "tracer-ebpf/src", "xtask/src"]
    found = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                if name.endswith(".rs"):
                    path = os.path.join(folder, name)
                    found += [(length, f"{path}:{line}", fn) for fn, line, length in functions(path) if length > limit]
    for length, where, fn in sorted(found, reverse=True):
        print(f"{length:5} {where} {fn}")


main()

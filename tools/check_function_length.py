#!/usr/bin/python3
"""Lists C++ functions longer than a limit (default 80 lines), so "no long functions" can be checked.

usage: tools/check_function_length.py [--max N] [DIR_OR_FILE ...]
Default folders: core/base core/io server trainer synth client (core/nn and tests/ are not checked).
Prints "path:line: name: N lines" per function over the limit and exits 1 if there is any.

The parse is deliberately simple: comments, string and character literals are blanked, then braces
are matched. A '{' opens a function body when it is not inside parentheses and what precedes it
(since the last ';', '{' or '}') ends like a function head: ')' optionally followed by const,
noexcept, override, final, mutable, '&', '&&' or a trailing return type. Everything nested in a body
(lambdas, blocks, local classes) counts toward it. Member functions defined inside a class count as
functions of their own. Length is counted from the line of the head to the closing brace.
"""
import argparse
import os
import re
import sys

DEFAULT_DIRS = ["core/base", "core/io", "server", "trainer", "synth", "client"]
EXTENSIONS = (".cc", ".h", ".cpp", ".hpp")

HEAD_END = re.compile(
    r"\)\s*(?:(?:const|noexcept|override|final|mutable|&&|&)\s*)*"
    r"(?:->\s*[\w:<>,\s\*&]+)?$")


def blank_literals(text):
    """Replaces comments and string/char literals by spaces, keeping newlines (line numbers)."""
    out = []
    i, n = 0, len(text)
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
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = ")" + m.group(1) + '"'
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # digit separator 1'000
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):  # preprocessor line (with continuations)
            j = i
            while True:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                    break
                if text[k - 1] != "\\":
                    break
                j = k + 1
            out.append(re.sub(r"[^\n]", " ", text[i:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(head):
    """The name before the parameter list of a function head (best effort)."""
    depth = 0
    # The parameter list is the first top-level '(' group after the name; skip an init list.
    for m in re.finditer(r"[()]", head):
        if m.group() == "(":
            if depth == 0:
                before = head[: m.start()].rstrip()
                name = re.search(r"(operator\s*\S+|~?[\w:~]+)$", before)
                if name:
                    return re.sub(r"\s+", " ", name.group(1))
            depth += 1
        else:
            depth -= 1
    return "?"


def long_functions(path, limit):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = blank_literals(f.read())
    results = []
    stack = []  # entries: "scope" (namespace/class/other) or ("function", start_line, name)
    paren = 0
    stmt_start = 0  # offset where the current statement/head began
    line = 1
    in_function = 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "(":
            paren += 1
        elif c == ")":
            paren = max(0, paren - 1)
        elif c == ";" and not in_function and paren == 0:
            stmt_start = i + 1
        elif c == "{":
            if in_function:
                stack.append("nested")
                in_function += 1
                continue
            if paren > 0:  # a braced initialiser inside an expression or an init list
                stack.append("scope")
                continue
            head = text[stmt_start:i]
            stripped = head.strip()
            if HEAD_END.search(stripped) and not re.match(r"(namespace|class|struct|union|enum)\b", stripped):
                first = stmt_start + (len(head) - len(head.lstrip()))
                start_line = text.count("\n", 0, first) + 1
                stack.append(("function", start_line, function_name(stripped)))
                in_function = 1
            else:
                stack.append("scope")
                stmt_start = i + 1
        elif c == "}":
            if not stack:
                continue
            top = stack.pop()
            if in_function:
                in_function -= 1
                if in_function == 0 and isinstance(top, tuple):
                    _, start_line, name = top
                    length = line - start_line + 1
                    if length > limit:
                        results.append((start_line, name, length))
            if not in_function and paren == 0:
                stmt_start = i + 1
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=80, help="longest allowed function, in lines")
    parser.add_argument("paths", nargs="*", help="folders or files (default: %s)" % " ".join(DEFAULT_DIRS))
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = args.paths or [os.path.join(root, d) for d in DEFAULT_DIRS]
    files = []
    for p in paths:
        if os.path.isdir(p):
            for dirpath, _, names in os.walk(p):
                files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(EXTENSIONS)]
        else:
            files.append(p)
    found = 0
    for path in sorted(files):
        for start_line, name, length in long_functions(path, args.max):
            print("%s:%d: %s: %d lines" % (os.path.relpath(path, os.getcwd()), start_line, name, length))
            found += 1
    if found:
        print("%d function(s) over %d lines" % (found, args.max))
        return 1
    print("no function over %d lines" % args.max)
    return 0


if __name__ == "__main__":
    sys.exit(main())

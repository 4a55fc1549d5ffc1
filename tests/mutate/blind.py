#!/usr/bin/env python3
"""The blind sampler of `make mutate`: one-line mutations generated
mechanically from the source, never chosen by looking at the tests.

    blind.py ROOT COUNT SEED      print COUNT mutations drawn with SEED
    blind.py ROOT --all           print every candidate (to inspect)

Sources (found by globbing, so files moved between folders are still found):
lib/**/*.c, tools/**/*.c, tools/**/*.h (the command's code is in headers it
includes once) and python/**/*.py outside python/tests. Lines that
are only comment (or a Python docstring), blank lines and preprocessor lines
(except `#define NAME NUMBER`) are skipped; string literals and comments
inside a line are never touched. The kinds of mutation:

  comparison   == <-> !=, < -> <=, <= -> <, > -> >=, >= -> >  (Python: also
               `is` <-> `is not`, `in` <-> `not in`)
  condition    the condition of an if / while (on one line) negated, or one
               operand of its top-level && / || (and / or) dropped
  constant     an integer literal N -> N + 1 or N - 1
  call         a statement that only calls something named *unlock*, *wait*
               or *sync* (synchronise) dropped
  swap         a field read or written through -> or . replaced by another
               field of the same struct and declared type; two adjacent plain
               arguments of a call swapped

The draw: each kind's candidates are shuffled with random.Random(SEED) and
taken in turn, one kind after the other, so every kind is represented. One
line per mutation, tab-separated: file, line number, original line, mutated
line, kind, description (with the enclosing function).
"""

import glob
import os
import random
import re
import sys

KINDS = ("comparison", "condition", "constant", "call", "swap")


def sources(root):
    files = set()
    for pattern in ("lib/**/*.c", "tools/**/*.c", "tools/**/*.h", "python/**/*.py"):
        for path in glob.glob(os.path.join(root, pattern), recursive=True):
            rel = os.path.relpath(path, root)
            if rel.startswith(os.path.join("python", "tests") + os.sep):
                continue
            files.add(rel)
    return sorted(files)


# ---- masking: which characters of a line are code ------------------------------


def string_end(line, i):
    """Where the string or character literal opening at line[i] ends (or the
    line's end)."""
    j = i + 1
    while j < len(line) and line[j] != line[i]:
        j += 2 if line[j] == "\\" else 1
    return min(j + 1, len(line))


def mask_lines(lines, python):
    """Per line, a string of the same length: 'c' where the character is
    code, ' ' inside a comment, a string or character literal, or (Python) a
    triple-quoted string. C: // and /* */; Python: # and triple quotes."""
    line_comment = "#" if python else "//"
    out = []
    closer = None  # what ends the block comment or triple-quoted string we are in
    for line in lines:
        m = []
        i = 0
        n = len(line)
        while i < n:
            if closer:
                if line.startswith(closer, i):
                    m.append(" " * len(closer))
                    i += len(closer)
                    closer = None
                else:
                    m.append(" ")
                    i += 1
                continue
            opener = next((o for o in (('"""', "'''") if python else ("/*",)) if line.startswith(o, i)), None)
            if opener:
                closer = opener if python else "*/"
                m.append(" " * len(opener))
                i += len(opener)
            elif line.startswith(line_comment, i):
                m.append(" " * (n - i))
                i = n
            elif line[i] in "\"'":
                j = string_end(line, i)
                m.append(" " * (j - i))
                i = j
            else:
                m.append("c")
                i += 1
        out.append("".join(m)[:n])
    return out


def mask_c(lines):
    return mask_lines(lines, False)


def mask_py(lines):
    return mask_lines(lines, True)


def code_spans(mask):
    """The code characters of a line, as (start, end) runs."""
    return [(mo.start(), mo.end()) for mo in re.finditer(r"c+", mask)]


def in_code(mask, start, end):
    return start >= 0 and end <= len(mask) and all(c == "c" for c in mask[start:end])


# ---- enclosing function ----------------------------------------------------------

C_FUNC = re.compile(r"^[A-Za-z_][\w \*]*?\b([A-Za-z_]\w*)\s*\([^;]*$")
PY_FUNC = re.compile(r"^\s*(?:async\s+)?def\s+(\w+)")


def functions(lines, python):
    names = []
    cur = "(file scope)"
    for line in lines:
        mo = (PY_FUNC if python else C_FUNC).match(line)
        if mo and (python or not line.startswith(("if", "else", "for", "while", "return", "static_assert"))):
            cur = mo.group(1)
        names.append(cur)
    return names


# ---- struct fields (for swaps) ---------------------------------------------------

FIELD_DECL = re.compile(r"^\s*((?:const\s+|unsigned\s+|signed\s+|struct\s+|_Atomic\s+)*[A-Za-z_]\w*(?:\s*\*+)?)\s*"
                        r"((?:\**\s*[A-Za-z_]\w*(?:\[[^\]]*\])?\s*,\s*)*\**\s*[A-Za-z_]\w*(?:\[[^\]]*\])?)\s*;")


def struct_fields(root):
    """Field name -> the other fields of its struct with the same declared
    type (only names that belong to one struct in the whole tree)."""
    groups = {}  # (file, struct start, type) -> [names]
    owners = {}  # name -> set of (file, struct start)
    paths = set()
    for pattern in ("lib/**/*.[ch]", "include/**/*.h", "tools/**/*.[ch]"):
        paths.update(glob.glob(os.path.join(root, pattern), recursive=True))
    for path in sorted(paths):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        masks = mask_c(lines)
        depth = 0
        stack = []  # per brace depth: struct start line or None
        pending_struct = None
        for k, (line, mask) in enumerate(zip(lines, masks)):
            code = "".join(ch if mc == "c" else " " for ch, mc in zip(line, mask))
            if re.search(r"\b(struct|union)\b[^;()]*$", code) or re.search(r"\b(struct|union)\b[^;()]*\{", code):
                pending_struct = k
            top = stack[-1] if stack else None
            if top is not None and depth == len(stack) and "{" not in code and "(" not in code:
                mo = FIELD_DECL.match(code)
                if mo:
                    base = " ".join(mo.group(1).split())
                    for part in mo.group(2).split(","):
                        part = part.strip()
                        stars = len(part) - len(part.lstrip("*"))
                        name_m = re.match(r"\**\s*([A-Za-z_]\w*)(\[[^\]]*\])?", part)
                        if not name_m:
                            continue
                        ftype = base + "*" * stars + (name_m.group(2) or "")
                        key = (path, top, ftype)
                        groups.setdefault(key, []).append(name_m.group(1))
                        owners.setdefault(name_m.group(1), set()).add((path, top))
            for ch in code:
                if ch == "{":
                    depth += 1
                    stack.append(pending_struct)
                    pending_struct = None
                elif ch == "}":
                    depth -= 1
                    if stack:
                        stack.pop()
            if ";" in code and "{" not in code:
                pending_struct = None
    siblings = {}
    for names in groups.values():
        for name in names:
            if len(owners.get(name, ())) != 1:
                continue
            others = [o for o in names if o != name]
            if others:
                siblings[name] = others
    return siblings


# ---- generating the candidates ----------------------------------------------------


def replace_at(line, start, end, text):
    return line[:start] + text + line[end:]


CMP_C = re.compile(r"<<=|>>=|<<|>>|->|==|!=|<=|>=|<|>")
CMP_SWAP = {"==": "!=", "!=": "==", "<": "<=", "<=": "<", ">": ">=", ">=": ">"}
INT_LIT = re.compile(r"(?<![\w.])(0[xX][0-9a-fA-F]+|\d+)([uUlL]*)(?![\w.])")
CALL_NAME = re.compile(r"(unlock|wait|sync)", re.I)


def matching_paren(code, open_at):
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "(":
            depth += 1
        elif code[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def top_level_split(text, ops):
    """Split text at top-level (depth 0) occurrences of ops (a regex)."""
    parts, depth, last = [], 0, 0
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            mo = re.compile(ops).match(text, i)
            if mo:
                parts.append((last, i))
                last = mo.end()
                i = mo.end()
                continue
        i += 1
    parts.append((last, len(text)))
    return parts


def candidates_for(root, rel, siblings):
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    python = rel.endswith(".py")
    masks = mask_py(lines) if python else mask_c(lines)
    funcs = functions(lines, python)
    out = []

    def add(k, new, kind, what):
        if new != lines[k]:
            out.append((rel, k + 1, lines[k], new, kind, f"{what} in {funcs[k]}"))

    for k, (line, mask) in enumerate(zip(lines, masks)):
        code = "".join(ch if mc == "c" else " " for ch, mc in zip(line, mask))
        stripped = code.strip()
        if not stripped:
            continue  # blank, or only comment / docstring
        is_define = False
        if not python and stripped.startswith("#"):
            if not re.match(r"#\s*define\s+\w+\s+\(?-?\s*(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\)?\s*$", stripped):
                continue
            is_define = True
        # constant
        for mo in INT_LIT.finditer(code):
            if not in_code(mask, mo.start(), mo.end()):
                continue
            if python and line[:mo.start()].rstrip().endswith(("e", "E")):
                continue
            text = mo.group(1)
            value = int(text, 16) if text[:2].lower() == "0x" else int(text)
            for nv in (value + 1, value - 1):
                if nv < 0:
                    continue
                new_text = (hex(nv) if text[:2].lower() == "0x" else str(nv)) + mo.group(2)
                add(k, replace_at(line, mo.start(1), mo.end(2), new_text), "constant", f"constant {text} -> {nv}")
        if is_define:
            continue
        # comparison
        if python:
            for mo in re.finditer(r"==|!=|<=|>=|(?<![<>-])<(?![<=])|(?<![<>-])>(?![>=])", code):
                if in_code(mask, mo.start(), mo.end()) and not code[:mo.start()].rstrip().endswith("-"):
                    op = mo.group(0)
                    add(k, replace_at(line, mo.start(), mo.end(), CMP_SWAP[op]), "comparison", f"'{op}' -> '{CMP_SWAP[op]}'")
            for mo in re.finditer(r"\bis not\b|\bnot in\b|\bis\b|\bin\b", code):
                op = mo.group(0)
                if op == "in" and (re.match(r"\s*for\b", code) or re.search(r"\bfor\s+[\w, ()]+\s*$", code[:mo.start()])):
                    continue  # for x in ...: a loop, not a test
                if op == "is" and code[mo.end():].startswith(" not"):
                    continue
                if op == "in" and code[:mo.start()].endswith("not "):
                    continue
                new_op = {"is not": "is", "not in": "in", "is": "is not", "in": "not in"}[op]
                add(k, replace_at(line, mo.start(), mo.end(), new_op), "comparison", f"'{op}' -> '{new_op}'")
        else:
            for mo in CMP_C.finditer(code):
                op = mo.group(0)
                if op in CMP_SWAP and in_code(mask, mo.start(), mo.end()):
                    add(k, replace_at(line, mo.start(), mo.end(), CMP_SWAP[op]), "comparison", f"'{op}' -> '{CMP_SWAP[op]}'")
        # condition
        if python:
            mo = re.match(r"^(\s*)(if|elif|while)\s+(.*):\s*$", code)
            if mo and in_code(mask, mo.start(3), mo.end(3)):
                cond = line[mo.start(3):mo.end(3)]
                add(k, line[:mo.start(3)] + f"not ({cond})" + line[mo.end(3):], "condition", "condition negated")
                parts = top_level_split(cond, r" and | or ")
                if len(parts) > 1:
                    for i, (a, b) in enumerate(parts):
                        rest = [cond[x:y].strip() for j, (x, y) in enumerate(parts) if j != i]
                        op = " and " if " and " in cond else " or "
                        add(k, line[:mo.start(3)] + op.join(rest) + line[mo.end(3):], "condition",
                            f"operand dropped: {cond[a:b].strip()}")
        else:
            for mo in re.finditer(r"\b(if|while)\s*\(", code):
                open_at = mo.end() - 1
                close = matching_paren(code, open_at)
                if close < 0 or not in_code(mask, open_at, open_at + 1):
                    continue
                cond = line[open_at + 1:close]
                add(k, line[:open_at + 1] + f"!({cond})" + line[close:], "condition", "condition negated")
                parts = top_level_split(cond, r"&&|\|\|")
                if len(parts) > 1:
                    op = " && " if "&&" in code[open_at:close] else " || "
                    for i, (a, b) in enumerate(parts):
                        rest = [cond[x:y].strip() for j, (x, y) in enumerate(parts) if j != i]
                        add(k, line[:open_at + 1] + op.join(rest) + line[close:], "condition",
                            f"operand dropped: {cond[a:b].strip()}")
        # call
        if python:
            mo = re.match(r"^(\s*)([\w.\[\]]+)\((.*)\)\s*$", code)
            if mo and CALL_NAME.search(mo.group(2).split(".")[-1]):
                add(k, mo.group(1) + "pass", "call", f"call dropped: {line.strip()}")
        else:
            mo = re.match(r"^(\s*)(?:\(void\)\s*)?([\w.>\-\[\]]+)\s*\((.*)\)\s*;\s*$", code)
            if mo and CALL_NAME.search(re.split(r"->|\.", mo.group(2))[-1]):
                add(k, mo.group(1) + ";", "call", f"call dropped: {line.strip()}")
        # swap: fields
        if not python:
            for mo in re.finditer(r"(->|\.)\s*([A-Za-z_]\w*)\b", code):
                name = mo.group(2)
                if name in siblings and in_code(mask, mo.start(), mo.end()) and not code[mo.end():].lstrip().startswith("("):
                    for other in siblings[name]:
                        add(k, replace_at(line, mo.start(2), mo.end(2), other), "swap",
                            f"field {name} -> {other} (same struct and type)")
        # swap: adjacent plain arguments of a call (not a function's own
        # parameters, where it is defined)
        simple = r"[A-Za-z_][\w]*(?:(?:->|\.)[A-Za-z_]\w*)*"
        if (PY_FUNC if python else C_FUNC).match(line):
            continue
        for mo in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", code):
            if mo.group(1) in ("if", "while", "for", "switch", "return", "sizeof", "def", "print"):
                continue
            open_at = mo.end() - 1
            close = matching_paren(code, open_at)
            if close < 0:
                continue
            args = top_level_split(code[open_at + 1:close], r",")
            for i in range(len(args) - 1):
                a0, a1 = args[i]
                b0, b1 = args[i + 1]
                ta = code[open_at + 1 + a0:open_at + 1 + a1].strip()
                tb = code[open_at + 1 + b0:open_at + 1 + b1].strip()
                if re.fullmatch(simple, ta) and re.fullmatch(simple, tb) and ta != tb and "=" not in ta + tb:
                    s = open_at + 1
                    seg = line[s + a0:s + b1]
                    swapped = seg.replace(ta, "\0A", 1)
                    swapped = swapped[::-1].replace(tb[::-1], "\0B"[::-1], 1)[::-1]
                    swapped = swapped.replace("\0A", tb).replace("\0B", ta)
                    add(k, line[:s + a0] + swapped + line[s + b1:], "swap",
                        f"arguments {ta}, {tb} of {mo.group(1)}() swapped")
    return out


def all_candidates(root):
    siblings = struct_fields(root)
    cands = []
    for rel in sources(root):
        cands.extend(candidates_for(root, rel, siblings))
    return cands


def draw(cands, count, seed):
    rng = random.Random(seed)
    by_kind = {kind: [c for c in cands if c[4] == kind] for kind in KINDS}
    for kind in KINDS:
        rng.shuffle(by_kind[kind])
    picked = []
    while len(picked) < count and any(by_kind.values()):
        for kind in KINDS:
            if by_kind[kind] and len(picked) < count:
                picked.append(by_kind[kind].pop())
    return picked


def main(argv):
    if len(argv) == 3 and argv[2] == "--all":
        picked = all_candidates(argv[1])
    elif len(argv) == 4:
        picked = draw(all_candidates(argv[1]), int(argv[2]), int(argv[3]))
    else:
        sys.stderr.write(__doc__)
        return 2
    for c in picked:
        fields = [str(x) for x in c]
        if any("\t" in f or "\n" in f for f in fields):
            continue
        print("\t".join(fields))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

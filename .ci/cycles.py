#!/usr/bin/env python3
"""Import circles between modules of a Rust crate's src/.

An edge m -> t means module m names an item defined in module t: a `use`
path or a path written in code that starts with `crate::`, `super::` or
`self::`, a child module's name (`child::x`, `use child::x`), or a name
m imported (`use super::caps;` then `caps::reserve`). Paths are followed
through every `use` (re-exports included) to the module that defines the
item. Comments, string literals and `#[cfg(test)] mod … { … }` bodies are
ignored; `use` trees may nest braces. Prints each strongly connected
component of two or more modules with its edges, then `N circles`.
`cycles.py src A B` prints instead the paths in module A that make A -> B.
"""
import os
import re
import sys

IDENT = r'[A-Za-z_][A-Za-z0-9_]*'


def strip(src):
    """The source without comments, string and char literals."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i)
            i = n if j < 0 else j
        elif src.startswith('/*', i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith('/*', i):
                    depth, i = depth + 1, i + 2
                elif src.startswith('*/', i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(' ')
        elif c == 'r' and re.match(r'r#*"', src[i:i + 260]) and not re.match(r'[A-Za-z0-9_]', src[i - 1] if i else ' '):
            hashes = re.match(r'r(#*)"', src[i:]).group(1)
            end = src.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == '\\' else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(?:\\[^']{1,10}|[^\\'])'", src[i:i + 14]):
            m = re.match(r"'(?:\\[^']{1,10}|[^\\'])'", src[i:i + 14])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def drop_test_modules(src):
    """`#[cfg(test)] mod name { … }` removed (braces matched)."""
    while True:
        m = re.search(r'#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+' + IDENT + r'\s*\{', src)
        if not m:
            return src
        depth, i = 1, m.end()
        while i < len(src) and depth:
            depth += {'{': 1, '}': -1}.get(src[i], 0)
            i += 1
        src = src[:m.start()] + src[i:]


def use_tree(text):
    """Expands a use tree into (path segments, name it binds; None for a glob)."""
    text = re.sub(r'\s+as\s+', '@', text)
    text = re.sub(r'\s+', '', text)
    if text.startswith('::'):
        text = text[2:]

    def split_top(s):
        parts, depth, cur = [], 0, ''
        for ch in s:
            if ch == ',' and depth == 0:
                parts.append(cur)
                cur = ''
                continue
            depth += {'{': 1, '}': -1}.get(ch, 0)
            cur += ch
        return parts + [cur]

    def expand(prefix, s):
        brace = s.find('{')
        if brace >= 0:
            head = s[:brace].rstrip(':')
            base = prefix + [seg for seg in head.split('::') if seg]
            inner = s[brace + 1:s.rfind('}')]
            return [u for part in split_top(inner) if part for u in expand(base, part)]
        path, _, alias = s.partition('@')
        segs = prefix + [seg for seg in path.split('::') if seg]
        if segs and segs[-1] == '*':
            return [(segs[:-1], None)]
        if segs and segs[-1] == 'self':
            segs = segs[:-1]
        return [(segs, alias or (segs[-1] if segs else None))]

    return expand([], text)


def main():
    root = sys.argv[1]
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'):
                continue
            p = os.path.join(dp, f)
            parts = os.path.relpath(p, root)[:-3].split(os.sep)
            if parts == ['main'] and os.path.exists(os.path.join(root, 'lib.rs')):
                continue  # the binary is its own crate: it names the library by name
            if parts[-1] in ('mod', 'lib', 'main'):
                parts = parts[:-1]
            mods['::'.join(parts)] = p

    def children(m):
        pre = m + '::' if m else ''
        return {c[len(pre):] for c in mods if c.startswith(pre) and c != m and '::' not in c[len(pre):]}

    def join(*parts):
        return '::'.join(p for p in parts if p)

    source, uses = {}, {}
    use_re = re.compile(r'(?<![A-Za-z0-9_])use\s+([^;]+);')
    for m, p in mods.items():
        src = drop_test_modules(strip(open(p).read()))
        uses[m] = [u for mt in use_re.finditer(src) for u in use_tree(mt.group(1))]
        source[m] = use_re.sub(' ', src)

    def absolute(m, segs):
        """Segments from the crate root, or None for a path outside the crate."""
        if not segs:
            return None
        base = m.split('::') if m else []
        if segs[0] == 'crate':
            return segs[1:]
        if segs[0] == 'self':
            return base + segs[1:]
        if segs[0] == 'super':
            while segs and segs[0] == 'super':
                base, segs = base[:-1], segs[1:]
            return base + segs
        if segs[0] in children(m):
            return base + segs
        if segs[0] in aliases.get(m, {}):
            return aliases[m][segs[0]] + segs[1:]
        return None

    aliases = {m: {} for m in mods}
    for _ in range(3):  # aliases naming aliases settle in a few rounds
        for m in mods:
            for segs, name in uses[m]:
                if name is None or name == 'self':
                    continue
                full = absolute(m, segs)
                if full is not None:
                    aliases[m][name] = full

    def defining(segs, depth=0):
        """The module that defines what the absolute path names."""
        cur = ''
        for i, seg in enumerate(segs):
            nxt = join(cur, seg)
            if nxt in mods:
                cur = nxt
            elif seg in aliases[cur] and depth < 10 and aliases[cur][seg] != segs[:i + 1]:
                return defining(aliases[cur][seg] + segs[i + 1:], depth + 1)
            else:
                return cur
        return cur

    edges = {m: set() for m in mods}
    why = {}
    path_re = re.compile(r'(?<![A-Za-z0-9_:$])(' + IDENT + r'(?:::' + IDENT + r')+)')
    for m in mods:
        found = [segs for segs, _ in uses[m]]
        found += [mt.group(1).split('::') for mt in path_re.finditer(source[m])]
        for segs in found:
            full = absolute(m, segs)
            if full is None:
                continue
            t = defining(full)
            if t != m:
                edges[m].add(t)
                why.setdefault((m, t), set()).add('::'.join(segs))

    if len(sys.argv) == 4:  # `cycles.py src A B`: the paths that make the edge A -> B
        for path in sorted(why.get((sys.argv[2], sys.argv[3]), ())):
            print(path)
        return
    idx, low, st, on, out, count = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def sc(v):
        idx[v] = low[v] = count[0]
        count[0] += 1
        st.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(mods):
        if v not in idx:
            sc(v)
    for comp in out:
        print(sorted(comp))
        for a in sorted(comp):
            print('   ', a or '(crate)', '->', sorted(t for t in edges[a] if t in comp))
    print(len(out), 'circles')


if __name__ == '__main__':
    main()

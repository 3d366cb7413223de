"""The CS224n handout's TODOs beside a student's copy: for every class of the handout's
bert.py, classifier.py, optimizer.py and multitask_classifier.py, each method's signature
and each attribute its __init__ sets, the handout's and the copy's, and whether they are the
same. The handout is a folder holding its files (a clone of gpoesia/minbert-default-final-
project or of amahankali10/CS224N-Spring2024-DFP-Student-Handout).

    python exercises.py make ../copy && python docs/scripts/handout_names.py HANDOUT ../copy
"""

import argparse
import ast
from pathlib import Path

FILES = ("bert.py", "classifier.py", "optimizer.py", "multitask_classifier.py")


def signature(f: ast.FunctionDef) -> str:
    """`name(arg, ...)`: the positional and keyword parameters' names, defaults aside."""
    a = f.args
    names = [x.arg for x in a.posonlyargs + a.args]
    names += [f"*{a.vararg.arg}"] if a.vararg else []
    names += [x.arg for x in a.kwonlyargs] + ([f"**{a.kwarg.arg}"] if a.kwarg else [])
    return f"{f.name}({', '.join(names)})"


def classes(path: Path) -> dict[str, dict]:
    """{class: {'methods': {name: signature}, 'attributes': [self.X set in __init__]}}."""
    out = {}
    for c in (n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)):
        functions = [f for f in c.body if isinstance(f, ast.FunctionDef)]
        methods = {f.name: signature(f) for f in functions}
        todo = {f.name for f in functions if "raise NotImplementedError" in ast.unparse(f)}
        init = next((f for f in c.body if getattr(f, "name", "") == "__init__"), None)
        attributes = [
            t.attr
            for node in ast.walk(init or ast.Module(body=[], type_ignores=[]))
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
            for t in (t.elts if isinstance(t, ast.Tuple) else [t])
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", "") == "self"
        ]
        out[c.name] = {
            "methods": methods,
            "todo": todo,
            "attributes": list(dict.fromkeys(attributes)),
        }
    return out


def rows(handout: Path, copy: Path):
    """(file, class, what, the handout's, the copy's) for each name the handout has; a
    method whose handout body raises (a TODO) is a "TODO method"."""
    for file in FILES:
        theirs, ours = classes(handout / file), classes(copy / file)
        for name, c in theirs.items():
            mine = ours.get(name, {"methods": {}, "attributes": []})
            for method, sig in c["methods"].items():
                kind = "TODO method" if method in c["todo"] else "method"
                yield file, name, kind, sig, mine["methods"].get(method, "-")
            for attr in c["attributes"]:
                yield file, name, "attribute", attr, attr if attr in mine["attributes"] else "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("handout", type=Path, help="a folder holding the handout's files")
    parser.add_argument("copy", type=Path, help="a student's copy (python exercises.py make)")
    args = parser.parse_args()
    print("| file | class | kind | the handout's | the copy's | same |")
    print("| --- | --- | --- | --- | --- | --- |")
    table = list(rows(args.handout, args.copy))
    for file, cls, kind, theirs, mine in table:
        print(
            f"| {file} | {cls} | {kind} | `{theirs}` | `{mine}` | {'yes' if theirs == mine else 'NO'} |"
        )
    same = sum(t == m for *_, t, m in table)
    print(f"\n{same} of {len(table)} the same")


if __name__ == "__main__":
    main()

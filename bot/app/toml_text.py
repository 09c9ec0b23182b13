"""Just enough TOML writing for `steward init`: tables of strings, numbers, booleans and
lists of strings, with a comment line per table. (The standard library reads TOML but
does not write it.)"""

import json


class Table(dict):
    def __init__(self, name: str, comment: str = ""):
        super().__init__()
        self.name = name
        self.comment = comment


def value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        # a JSON string is a TOML basic string: the same escapes (\" \\ \n \uXXXX)
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(value(item) for item in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def render(tables: list[Table], header: list[str] = ()) -> str:
    lines = [f"# {line}" for line in header]
    for table in tables:
        lines += ["", f"[{table.name}]"]
        if table.comment:
            lines.append(f"# {table.comment}")
        lines += [f"{key} = {value(v)}" for key, v in table.items()]
    return "\n".join(lines).lstrip("\n") + "\n"

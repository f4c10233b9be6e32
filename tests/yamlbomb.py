"""A YAML alias bomb for the hostile-config tests: nine levels of nine aliases
(9**9 values once expanded) in a file of a few hundred bytes."""


def alias_bomb(tail: str) -> str:
    """The bomb's anchors, then ``tail``, which may use ``*a8``."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(levels) + "\n" + tail

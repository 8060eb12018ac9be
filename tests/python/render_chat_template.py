"""Renders a chat template as Hugging Face's `apply_chat_template` does (jinja2's sandbox, trim_blocks,
lstrip_blocks, loop controls, `tojson` as json.dumps with ensure_ascii=False, `raise_exception`), for
tests/tests/chat_template.rs to compare byte for byte with the worker's minijinja rendering.

stdin: {"template", "messages", "tools" (or null), "bos_token", "eos_token"}; stdout: the rendering, exactly."""

import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    case = json.load(sys.stdin)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    out = env.from_string(case["template"]).render(
        messages=case["messages"],
        tools=case["tools"],
        add_generation_prompt=True,
        bos_token=case["bos_token"],
        eos_token=case["eos_token"],
    )
    sys.stdout.buffer.write(out.encode("utf-8"))


if __name__ == "__main__":
    main()

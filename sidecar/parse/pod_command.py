"""vLLM's command line as its container's spec in a pod declares it (`GET pod`). Pure.

Where the sidecar cannot see vLLM's processes (another container of the pod, without `shareProcessNamespace`),
the pod's spec still says what vLLM was started with; a death's reading uses it where vLLM's log tail no longer
states its flags. Only a spec that says it exactly is used, since a flag assumed at vLLM's default when it was
set elsewhere could turn a "lower the budget" into a raise:

- `command` given: `command` + `args`, as the kubelet runs them; a shell's `-c SCRIPT` is the script, and only
  when it holds no `$` or backquote (a shell variable's value is not in the spec);
- no `command`: the image's entrypoint runs with `args`; used for vLLM's own images only (`vllm/vllm-openai`,
  `-rocm`, `-cpu`, from any registry), whose entrypoint is vLLM's server with no flags of its own;
- `$(NAME)` is expanded from the container's `env` entries with a literal `value`, `$$` is a `$`, as the kubelet
  does; a reference to any other variable (from a Secret, a ConfigMap, `envFrom`, or undefined) leaves the
  command unknown;
- the result must start vLLM's OpenAI server (`vllm serve`, `vllm.entrypoints.openai.api_server`).

Secret flags' values are redacted (`vllm_process.redacted`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sidecar.parse.vllm_process import ProcessRole, redacted, role_of

VLLM_IMAGE = re.compile(r"(?:^|/)vllm/vllm-openai(?:-rocm|-cpu)?(?::[\w.-]+)?(?:@sha256:[0-9a-f]+)?$")
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh"})
_REFERENCE = re.compile(r"\$\$|\$\(([^)]*)\)")


class _UnknownValueError(Exception):
    """A value the spec does not hold."""


def declared_command(pod: Mapping[str, object], container: str) -> str | None:
    """The command line `container` of `pod` (a Pod as the API returns it) runs, redacted; None where the spec
    does not say it exactly."""
    found = _container(pod, container)
    text = _text(found) if found is not None else None
    if text is None or role_of(text) is not ProcessRole.API_SERVER:
        return None
    return redacted(" ".join(text.split()))


def _container(pod: Mapping[str, object], name: str) -> Mapping[str, object] | None:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if not isinstance(containers, list):
        return None
    return next((c for c in containers if isinstance(c, Mapping) and c.get("name") == name), None)


def _text(container: Mapping[str, object]) -> str | None:
    command, args = _words(container.get("command")), _words(container.get("args"))
    if command is None or args is None:
        return None
    env = _literal_env(container)
    try:
        words = [_expanded(word, env) for word in [*command, *args]]
    except _UnknownValueError:
        return None
    if command:
        return _script_or_words(words)
    image = container.get("image")
    return " ".join(["vllm", "serve", *words]) if isinstance(image, str) and VLLM_IMAGE.search(image) else None


def _words(value: object) -> list[str] | None:
    if value is None:
        return []
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return list(value)
    return None


def _literal_env(container: Mapping[str, object]) -> dict[str, str | None]:
    """Each variable the container defines, with its literal value, or None where the spec does not hold it."""
    env: dict[str, str | None] = {}
    entries = container.get("env")
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, Mapping) and isinstance(name := entry.get("name"), str):
            value = entry.get("value", "")  # `value` left out: the empty string
            env[name] = value if isinstance(value, str) and "valueFrom" not in entry else None
    return env


def _expanded(word: str, env: Mapping[str, str | None]) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        value = env.get(match.group(1))
        if value is None:  # from a Secret or a ConfigMap, from envFrom, or undefined (left as written)
            raise _UnknownValueError
        return value

    return _REFERENCE.sub(one, word)


def _script_or_words(words: list[str]) -> str | None:
    program = words[0].rsplit("/", 1)[-1]
    if program not in _SHELLS:
        return " ".join(words)
    script = next((words[i + 1] for i, word in enumerate(words[:-1]) if re.fullmatch(r"-[a-z]*c[a-z]*", word)), None)
    if script is None or "$" in script or "`" in script:
        return None
    return script

"""tally's configuration from Python: the keys of TALLY_CONF
(docs/configuration.md), set with tally_configure and read back."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Union

from ._lib import call, collect_text, encode

__all__ = ["configure", "conf_string", "options", "options_text"]

Conf = Union[str, Mapping[str, Any]]


def conf_string(conf: Conf) -> str:
    """A configuration as TALLY_CONF text: strings pass through, a mapping
    becomes ``key:value,key:value`` (booleans as true / false)."""
    if isinstance(conf, str):
        return conf
    parts = []
    for key, value in conf.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        parts.append(f"{key}:{value}")
    return ",".join(parts)


def configure(conf: Conf) -> None:
    """Set configuration keys (TallyError naming the bad key otherwise).
    Before tally starts any key may be set; afterwards only runtime keys."""
    text = conf_string(conf)
    if text:
        call("tally_configure", encode(text))


def options_text() -> str:
    """The configuration in effect, one ``key:value    # help`` line each."""
    return collect_text("tally_write_options")


def options() -> Dict[str, str]:
    """The configuration in effect as a dict of key -> value text."""
    result = {}
    for line in options_text().splitlines():
        setting = line.split("    #", 1)[0].strip()  # the writer pads before its help
        if ":" in setting:
            key, value = setting.split(":", 1)
            result[key] = value
    return result

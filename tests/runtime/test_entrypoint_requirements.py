"""Stage 3's requirement check on its own: versions, markers, and the extras a plugin asks for,
followed through the distributions' own metadata."""

from __future__ import annotations

import pytest

from runtime.entrypoint.requirements import Available, unmet_requirement

IMAGE = {
    "vllm": Available("0.27.1", ("fastapi<0.137,>=0.133",)),
    "torch": Available("2.13.0a0+nv26.08", ()),
    "fast-io": Available(
        "3.0", ('uvloop>=0.19; extra == "speed"', 'orjson>=3; extra == "speed"', "anyio")
    ),
    "uvloop": Available("0.21", ('cython-rt; extra == "build"',)),
    "orjson": Available("2.9", ()),
    "anyio": Available("4.0", ()),
    "loops": Available("1.0", ('loops[a]; extra == "a"', 'loops[b]; extra == "b"')),
}


def _unmet(*requires: str) -> str | None:
    return unmet_requirement("demo", requires, IMAGE.get)


@pytest.mark.parametrize(
    "requires",
    [
        ("vllm==0.27.1", "anyio"),
        ("torch>=2.12",),  # an installed pre-release satisfies a range, as for pip
        ('missing-lib>=1; python_version < "3"',),  # not for this interpreter
        ('missing-lib; extra == "dev"',),  # the plugin's own extra: pip installs none
        ("fast-io",),  # fast-io lacks orjson>=3, but only its extra asks for that
        ("uvloop[build]; python_version < '3'",),
        ("loops[a,b]",),  # extras that ask for each other end
    ],
)
def test_met_requirements_pass(requires: tuple[str, ...]) -> None:
    assert _unmet(*requires) is None


@pytest.mark.parametrize(
    ("requires", "reason"),
    [
        (("vllm>=0.30",), "plugin demo requires 'vllm>=0.30' but vllm is 0.27.1"),
        (("anyio", "missing-lib>=1"),
         "plugin demo requires 'missing-lib>=1' but missing-lib is not installed"),
        (
            ("fast-io[speed]>=3",),
            "plugin demo requires 'fast-io[speed]>=3', and fast-io[speed] requires 'orjson>=3; "
            "extra == \"speed\"' but orjson is 2.9",
        ),
        (
            ("Fast_IO[Speed]", "orjson>=2"),
            "and fast-io[speed] requires 'orjson>=3; extra == \"speed\"' but orjson is 2.9",
        ),
        (
            ("fast-io", "uvloop[build]"),
            "plugin demo requires 'uvloop[build]', and uvloop[build] requires 'cython-rt; "
            "extra == \"build\"' but cython-rt is not installed",
        ),
    ],
)  # fmt: skip
def test_unmet_requirements_say_which_and_why(requires: tuple[str, ...], reason: str) -> None:
    found = _unmet(*requires)
    assert found is not None and found.endswith(reason), found


def test_an_extra_of_an_extra_is_followed() -> None:
    image = {
        **IMAGE,
        "outer": Available("1.0", ('fast-io[speed]; extra == "all"',)),
    }
    found = unmet_requirement("demo", ("outer[all]",), image.get)
    assert found == (
        "plugin demo requires 'outer[all]', and outer[all] requires 'fast-io[speed]; "
        'extra == "all"\', and fast-io[speed] requires \'orjson>=3; extra == "speed"\' '
        "but orjson is 2.9"
    )


def test_a_requirement_that_cannot_be_parsed_is_named() -> None:
    image = {**IMAGE, "broken": Available("1.0", ('ok; extra == "x"', "not a requirement!"))}
    with pytest.raises(ValueError, match=r"broken\[x\] declares a requirement that cannot be"):
        unmet_requirement("demo", ("broken[x]",), image.get)
    with pytest.raises(ValueError, match="plugin demo declares a requirement"):
        unmet_requirement("demo", ("==1",), image.get)

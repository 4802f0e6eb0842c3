"""The settings table all three processes read their settings by (toolkit.envtable): the order of
precedence (an option given > the variable, set and not empty > the default), the one wording of
a refusal for every kind, a secret never written, prefix rows, and the reference table the docs
carry. The processes' own tables are tested through their settings (tests/controller,
tests/dispatcher, tests/sidecar) and their docs pages by tests/lint/test_settings_docs.py."""

from __future__ import annotations

import pytest

from toolkit import envtable

WORKERS = envtable.Setting("X_WORKERS", "workers", envtable.whole(1, 64), "Workers.", default=4, option="--workers")
TABLE = (
    WORKERS,
    envtable.Setting("X_ON", "on", envtable.BOOLEAN, "On.", default=True, option="--on"),
    envtable.Setting("X_WAIT", "wait", envtable.seconds(0.01, 3600), "Wait.", default=2.0),
    envtable.Setting("X_LEVEL", "level", envtable.choice("debug", "info"), "Level.", default="info"),
    envtable.Setting("X_NS", "ns", envtable.DNS_LABEL, "Namespace.", shown="the pod's own"),
    envtable.Setting("X_URL", "url", envtable.TEXT, "URL.", required=True),
    envtable.Setting("X_TOKEN", "token", envtable.text("token", "a token", str.isalnum), "Token.", default="",
                     secret=True),
    envtable.Setting("PASS_A_*", "passed", envtable.TEXT, "Passed on."),
    envtable.Setting("PASS_B_*", "passed", envtable.TEXT, "Passed on too."),
)
URL = {"X_URL": "u"}


def read(env: dict[str, str], **options: object) -> dict[str, object]:
    return envtable.read(TABLE, env, options=options)


def refusal(env: dict[str, str], **options: object) -> str:
    with pytest.raises(envtable.SettingsError) as e:
        read(env, **options)
    return str(e.value)


def test_the_defaults_where_nothing_is_set() -> None:
    assert read(URL) == {"workers": 4, "on": True, "wait": 2.0, "level": "info", "ns": None, "url": "u",
                         "token": "", "passed": ()}


def test_an_option_beats_the_variable_which_beats_the_default_and_empty_is_unset() -> None:
    assert read(URL)["workers"] == 4
    assert read({**URL, "X_WORKERS": ""})["workers"] == 4
    assert read({**URL, "X_WORKERS": "8"})["workers"] == 8
    assert read({**URL, "X_WORKERS": "8"}, workers="16")["workers"] == 16
    assert read({**URL, "X_WORKERS": "8"}, workers=32)["workers"] == 32  # a typed option, held to the bound
    assert read({**URL, "X_WORKERS": "8"}, workers=None)["workers"] == 8  # an option not given
    assert read({**URL, "X_ON": "true"}, on=False)["on"] is False


def test_an_option_the_table_does_not_have_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="unknown settings: wait"):
        read(URL, wait="1")


@pytest.mark.parametrize(("env", "message"), [
    ({"X_WORKERS": "ten"}, "X_WORKERS='ten': expected a whole number from 1 to 64"),
    ({"X_WORKERS": "65"}, "X_WORKERS=65: expected a whole number from 1 to 64"),  # a number: as read
    ({"X_WORKERS": "+8"}, "X_WORKERS='+8': expected a whole number from 1 to 64"),
    ({"X_WORKERS": "８"}, "X_WORKERS='８': expected a whole number from 1 to 64"),
    ({"X_ON": "yes"}, "X_ON='yes': expected true or false"),
    ({"X_WAIT": "soon"}, "X_WAIT='soon': expected a number of seconds from 0.01 to 3600"),
    ({"X_WAIT": "0"}, "X_WAIT=0: expected a number of seconds from 0.01 to 3600"),
    ({"X_WAIT": "nan"}, "X_WAIT=nan: expected a number of seconds from 0.01 to 3600"),
    ({"X_LEVEL": "loud"}, "X_LEVEL='loud': expected one of debug or info"),
    ({"X_NS": "Team_A"}, "X_NS='Team_A': expected a DNS-1123 label (lowercase letters, digits and '-', at most 63)"),
    ({"X_NS": "ns\n"}, "X_NS='ns\\n': expected a DNS-1123 label (lowercase letters, digits and '-', at most 63)"),
    ({"X_TOKEN": "s3cr3t!"}, "X_TOKEN: expected a token"),  # a secret: never its value
])
def test_a_bad_value_is_one_line_naming_the_variable_and_what_it_takes(env: dict[str, str], message: str) -> None:
    assert refusal({**URL, **env}) == message


def test_a_bad_option_names_the_option() -> None:
    assert refusal(URL, workers="0") == "--workers=0: expected a whole number from 1 to 64"
    assert refusal(URL, workers=1.5) == "--workers=1.5: expected a whole number from 1 to 64"
    assert refusal(URL, workers=True) == "--workers=True: expected a whole number from 1 to 64"


def test_a_required_variable_unset_or_empty_is_named() -> None:
    assert refusal({}) == "X_URL is required and not set"
    assert refusal({"X_URL": ""}) == "X_URL is required and not set"


def test_blanks_around_a_number_a_boolean_or_a_choice_are_ignored_and_text_is_taken_as_given() -> None:
    values = read({**URL, "X_WORKERS": " 8 ", "X_ON": " FALSE ", "X_WAIT": " 2.5", "X_LEVEL": "DEBUG "})
    assert (values["workers"], values["on"], values["wait"], values["level"]) == (8, False, 2.5, "debug")
    assert read({"X_URL": " u "})["url"] == " u "


def test_a_kind_may_say_why_in_its_own_words() -> None:
    def even(text: str) -> int:
        if int(text) % 2:
            raise envtable.Invalid("odd, and it must be even")
        return int(text)
    row = envtable.Setting("X_EVEN", "even", envtable.Kind("even", "an even number", even), "Even.")
    with pytest.raises(envtable.SettingsError, match=r"^X_EVEN='3': odd, and it must be even$"):
        envtable.read((row,), {"X_EVEN": "3"})


def test_prefix_rows_gather_every_variable_with_the_prefix_sorted_into_one_field() -> None:
    env = {**URL, "PASS_B_Z": "1", "PASS_A_Y": "", "PASS_B_A": "x y", "PASS_C": "no"}
    assert read(env)["passed"] == (("PASS_A_Y", ""), ("PASS_B_A", "x y"), ("PASS_B_Z", "1"))


def test_the_reference_table_has_a_row_per_setting_with_what_it_takes() -> None:
    assert envtable.markdown(TABLE).splitlines() == [
        "| option | variable | default | value | meaning |",
        "| --- | --- | --- | --- | --- |",
        "| `--workers` | `X_WORKERS` | `4` | a whole number from 1 to 64 | Workers. |",
        "| `--on/--no-on` | `X_ON` | `true` | true or false | On. |",
        "| — | `X_WAIT` | `2` | a number of seconds from 0.01 to 3600 | Wait. |",
        "| — | `X_LEVEL` | `info` | one of debug or info | Level. |",
        "| — | `X_NS` | the pod's own | a DNS-1123 label (lowercase letters, digits and '-', at most 63) | Namespace. |",
        "| — | `X_URL` | **required** | any text | URL. |",
        "| — | `X_TOKEN` | — | a token | Token. |",
        "| — | `PASS_A_*` | — | any text | Passed on. |",
        "| — | `PASS_B_*` | — | any text | Passed on too. |",
    ]
    without_options = envtable.markdown(TABLE[2:3]).splitlines()
    assert without_options[0] == "| variable | default | value | meaning |"
    assert without_options[2] == "| `X_WAIT` | `2` | a number of seconds from 0.01 to 3600 | Wait. |"


def test_a_bar_in_a_cell_does_not_end_it() -> None:
    row = envtable.Setting("X_A", "a", envtable.TEXT, "a | b")
    assert envtable.markdown((row,)).splitlines()[2] == "| `X_A` | — | any text | a \\| b |"

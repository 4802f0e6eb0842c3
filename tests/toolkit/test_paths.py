"""toolkit.paths quotes each segment itself (the sidecar must not pay for
urllib.parse): every answer must be urllib.parse.quote(segment, safe="")'s."""

from __future__ import annotations

import urllib.parse

import hypothesis
import hypothesis.strategies as st
import pytest

from toolkit import paths


@hypothesis.given(st.text(min_size=1))  # an empty name is no segment at all
@hypothesis.example("a/b?c#d%e f")
@hypothesis.example("..")
@hypothesis.example("é~_.-Z9")
def test_a_segment_is_quoted_as_urllib_quotes_it(segment: str) -> None:
    assert paths.TRAINJOB.path(namespace="ns", name=segment) == (
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/" + urllib.parse.quote(segment, safe=""))


def test_a_lone_surrogate_is_refused_as_urllib_refuses_it() -> None:
    with pytest.raises(UnicodeEncodeError):
        urllib.parse.quote("\ud800", safe="")
    with pytest.raises(UnicodeEncodeError):
        paths.JOBSET.path(namespace="ns", name="\ud800")

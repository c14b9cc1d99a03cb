"""Observations survive the JSON round trip replay depends on (property-based)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from controlplane.engine.observation import NodeView, Observation, PodView, ProbeError, TagView

text = st.text(max_size=12)
labels = st.dictionaries(text, text, max_size=3)
errors = st.builds(ProbeError, text, text, st.booleans())
pods = st.one_of(st.none(), errors, st.builds(
    PodView, text, text, text, st.one_of(st.none(), text),
    st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
    st.booleans(), st.booleans(), labels, labels, text))
tags = st.one_of(st.none(), errors, st.builds(TagView, text, text, labels))
nodes = st.one_of(st.none(), errors, st.builds(NodeView, text, st.booleans(), st.booleans(),
                                               labels))
observations = st.builds(Observation, st.dictionaries(text, pods, max_size=3),
                         st.dictionaries(text, tags, max_size=3),
                         st.dictionaries(text, nodes, max_size=3))


@given(observations)
def test_an_observation_round_trips_through_json_unchanged(obs: Observation) -> None:
    assert Observation.from_json(json.loads(json.dumps(obs.to_json()))) == obs


def test_a_probe_error_is_never_read_back_as_absent() -> None:
    """Gate 3 rests on this: an error and 'not found' stay distinguishable."""
    obs = Observation(tags={"r/a:t": ProbeError("Unavailable", "503")}, pods={"ns/p": None})
    back = Observation.from_json(obs.to_json())
    assert isinstance(back.tags["r/a:t"], ProbeError)
    assert back.pods["ns/p"] is None

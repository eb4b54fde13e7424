"""What each registered recurrence declares to the floors above it."""

from attnlab.models.recurrence import RECURRENCES, available_recurrences, emits_ponder_steps, register_recurrence


def test_only_act_declares_ponder_steps_and_a_name_alone_declares_nothing():
    assert {name for name in available_recurrences() if emits_ponder_steps(name)} == {"ut_act"}
    # a plugin named like ACT is not taken for it (the ponder callback once matched names ending in "act")
    register_recurrence("plugin_fact", options=object, encoder=object, decoder=object)
    try:
        assert not emits_ponder_steps("plugin_fact")
    finally:
        RECURRENCES._entries.pop("plugin_fact")


def test_the_built_in_recurrences_are_registered_by_importing_the_registry_alone():
    # the package imports stacked.py and universal.py before this module; nothing is loaded lazily on lookup
    assert available_recurrences() == ["stacked", "ut", "ut_act"]
    assert not emits_ponder_steps("no_such_recurrence")

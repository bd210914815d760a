"""The flags and ``main()`` of every ``python -m trainer...`` command.

One module per command. Each parses its flags with
:class:`features.cli.CommandParser` and imports torch, pyarrow and the
training code only afterwards, so ``--help`` and flag errors answer at once.
A module a user runs that also holds library code (``trainer.fit``,
``trainer.daemon``...) hands over to its command here first thing, before
its own heavy imports.
"""

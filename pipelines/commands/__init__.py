"""The flags and ``main()`` of the ``python -m pipelines...`` commands whose
module also holds heavy library code (``pipelines.reference``,
``pipelines.movielens``).

One module per command. Each parses its flags with
:class:`features.cli.CommandParser` and imports numpy, pandas and pyarrow
only afterwards, so ``--help`` and flag errors answer at once; the library
module hands over to its command here first thing, before its own imports.
"""

"""The 10M-document scale benchmark (issue 15): a streamed synthetic corpus, the embedded engine
against its peers in one run. Entry point: ``python -m benchmarks.scale`` (:mod:`.run`)."""

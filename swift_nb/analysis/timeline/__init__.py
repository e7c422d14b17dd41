"""The timeline as data: ``query`` (the engine: a window at a pixel width, level of detail),
its rows (``tracks``), its counters (``counters``), the places findings point at
(``places``) and a job's ranks overview (``ranks``)."""

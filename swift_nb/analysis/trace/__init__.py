"""The trace model: a torch.profiler trace decoded (``decode``) into columnar tables
(``tables``: ``Trace``), and the shapes of its operators' inputs (``shapes``). The analyses
above read these tables; none of them parses JSON."""

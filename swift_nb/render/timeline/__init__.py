"""The timeline's view: the payload and static picture (``view``) and the viewer's JavaScript
(``static/``), shared by report.html and the notebook's widget."""

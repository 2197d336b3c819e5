"""Where panel labels are read (``read``: OCR near the panels' corners, one label per panel by the
a, b, c... sequence) and where they correct the panels: a panel cut at a second label inside it
(``split``), read labels taken out of the boxes (``trim``)."""

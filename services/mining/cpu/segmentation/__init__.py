"""Where a figure is split into panels: the rules (``segment``), the seam splitter between
touching panels (``seams``, reading the panel-boundary network ``seam_net``), the caption's panel
count (``count_guided``), and the y-axis text handed back to its plot (``axis_strips``)."""

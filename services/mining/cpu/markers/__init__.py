"""Where markers (arrows, asterisks, boxes, insets...) are found on photographic panels: the rules
and the fusion with the network (``rules``), and the marker network with its fusion model
(``net``)."""

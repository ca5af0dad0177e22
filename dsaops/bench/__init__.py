"""`dsaops bench`: what a deployment serves under load (`bench serve`) and what it answers
(`bench eval`), next to what the plan promised and what a reference deployment scored."""

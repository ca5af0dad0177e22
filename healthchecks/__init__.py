"""dsaops.healthchecks"""

"""dsaops.kernels"""

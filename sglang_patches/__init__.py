"""dsaops.sglang_patches"""

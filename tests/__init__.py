"""The test suite: one folder per code folder; support/ holds the helpers several folders share."""

"Speculative decoding (chapter 12): proposers and the verification of their drafts."

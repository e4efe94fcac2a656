"""Conversations -> token ids, loss masks, image costs and positions (no Energon, no torch).

``chat`` reads a conversation document into turns; ``builtin`` lays them out as ChatML with
Qwen2-VL vision tokens; ``tokenizer`` adapts whatever tokenizer the user has; ``vision`` costs
images from their headers and turns them into Qwen2-VL patches; ``positions`` computes 1-D or
mRoPE positions of one conversation.
"""

"""Chat templates of real model families, written following each family's published format,
for processors built offline (:mod:`.families`).

Sources (the checkpoint's chat_template / tokenizer_config.json):
- QWEN2_VL_TEMPLATE: Qwen/Qwen2-VL-*-Instruct and Qwen/Qwen2.5-VL-*-Instruct (identical templates).
- QWEN3_VL_TEMPLATE: Qwen/Qwen3-VL-*-Instruct (tools branch included).
- GEMMA3_TEMPLATE: google/gemma-3-*-it.
- IDEFICS3_TEMPLATE: HuggingFaceM4/Idefics3-8B-Llama3; SMOLVLM_TEMPLATE: HuggingFaceTB/SmolVLM-*
  (its turns, after ``<|im_start|>``).
- LLAVA_ONEVISION_TEMPLATE: llava-hf/llava-onevision-qwen2-*-ov-hf (from transformers'
  convert_llava_onevision_weights_to_hf.py; the only one with {% generation %} markers).
- GEMMA4_TEMPLATE: google/gemma-4-*-it, its turn and image markup (``<|turn>role`` ...
  ``<turn|>``, ``model`` for the assistant, each image as ``<|image|>``, text trimmed), without
  the tools and thinking-channel branches.
- ERNIE_VL_TEMPLATE: baidu/ERNIE-4.5-VL-*-PT, its turn markup (``User: `` ... ``\nAssistant: ``
  ... ``<|end_of_sentence|>``) and each image as ``<|IMAGE_START|><|IMAGE_PLACEHOLDER|>
  <|IMAGE_END|>``, without its "Picture n:" numbering and thinking branches.
- GLM4V_TEMPLATE: zai-org/GLM-4.1V-9B-Thinking (``[gMASK]<sop>``, role tags, each image as
  ``<|begin_of_image|><|image|><|end_of_image|>``; an assistant's list content rendered in
  place as GLM-4.5V's ``visible_text`` does).
- QWEN2_5_OMNI_TEMPLATE: Qwen/Qwen2.5-Omni-* (Qwen2-VL's, with audio parts and
  ``<|vision_bos|>`` / ``<|audio_bos|>`` markers).
- QWEN3_OMNI_TEMPLATE: Qwen3-VL's, with Qwen3-Omni's audio part
  (``<|audio_start|><|audio_pad|><|audio_end|>``); written here, not copied from a checkpoint.
- GEMMA3N_TEMPLATE: google/gemma-3n-*-it: Gemma 3's, each image as ``<image_soft_token>`` and
  each audio clip as ``<audio_soft_token>`` (the processor expands both).
"""

__all__ = [
    "ERNIE_VL_TEMPLATE",
    "GEMMA3N_TEMPLATE",
    "GEMMA3_TEMPLATE",
    "GEMMA4_TEMPLATE",
    "GLM4V_TEMPLATE",
    "IDEFICS3_TEMPLATE",
    "LLAVA_ONEVISION_TEMPLATE",
    "QWEN2_5_OMNI_TEMPLATE",
    "QWEN2_VL_TEMPLATE",
    "QWEN3_OMNI_TEMPLATE",
    "QWEN3_VL_TEMPLATE",
    "SMOLVLM_TEMPLATE",
    "chatml_interleaved",
]

QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN2_5_OMNI_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}"
    "{% if add_audio_id %}Audio {{ audio_count.value }}: {% endif %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN3_VL_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

_IDEFICS3_BODY = (
    "{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
IDEFICS3_TEMPLATE = "<|begin_of_text|>" + _IDEFICS3_BODY
#: HuggingFaceTB/SmolVLM-*-Instruct: Idefics3's turns after ChatML's start token
SMOLVLM_TEMPLATE = "<|im_start|>" + _IDEFICS3_BODY

LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}"
    "{{'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

GEMMA4_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<|turn>{{ role }}\n{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}<|image|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}"
    "{% endif %}<turn|>\n{% endfor %}{% if add_generation_prompt %}<|turn>model\n{% endif %}"
)

ERNIE_VL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}User: {% elif message['role'] == 'assistant' %}"
    "{{ '\\n' }}Assistant: {% endif %}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{% if item['type'] == 'image' %}"
    "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>{% elif item['type'] == 'text' %}"
    "{{ item['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}<|end_of_sentence|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n' }}Assistant: {% endif %}"
)

_GLM4V_PARTS = (
    "{% for item in content %}"
    "{% if item.type == 'video' or 'video' in item %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% elif item.type == 'image' or 'image' in item %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif item.type == 'text' %}{{ item.text }}{% endif %}{% endfor %}"
)
GLM4V_TEMPLATE = (
    "{% macro visible(content) %}{% if content is string %}{{ content }}{% else %}"
    + _GLM4V_PARTS
    + "{% endif %}{% endmacro %}[gMASK]<sop>{% for msg in messages %}"
    "{% if msg.role == 'system' %}<|system|>\n{{ visible(msg.content) }}"
    "{% elif msg.role == 'user' %}<|user|>\n{{ visible(msg.content) }}"
    "{% elif msg.role == 'assistant' %}<|assistant|>\n{{ visible(msg.content) }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def chatml_interleaved(image: str, *, video: str | None = None) -> str:
    """ChatML with each image part written in place as ``image`` (the placeholder its processor
    expands), for the families whose published templates interleave it so (InternVL's
    ``<IMG_CONTEXT>``, LLaVA-NeXT's and Aya Vision's ``<image>``); each video part as
    ``video`` where given (InternVL's ``<video>``)."""
    videos = "{% elif part['type'] == 'video' %}{{ '" + video + "\\n' }}" if video else ""
    return (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}"
        "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
        "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
        "{{ '" + image + "\\n' }}" + videos + "{% elif part['type'] == 'text' %}"
        "{{ part['text'] }}{% endif %}"
        "{% endfor %}{% endif %}{{'<|im_end|>' + '\\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )


#: Qwen3-VL's template with an audio part, as Qwen3-Omni renders one
QWEN3_OMNI_TEMPLATE = QWEN3_VL_TEMPLATE.replace(
    "{%- set image_count = namespace(value=0) %}",
    "{%- set image_count = namespace(value=0) %}\n{%- set audio_count = namespace(value=0) %}",
).replace(
    """                {%- elif content.type == 'video' or 'video' in content %}""",
    """                {%- elif content.type == 'audio' or 'audio' in content or 'audio_url' in content %}
                    {%- set audio_count.value = audio_count.value + 1 %}
                    {%- if add_audio_id %}Audio {{ audio_count.value }}: {% endif -%}
                    <|audio_start|><|audio_pad|><|audio_end|>
                {%- elif content.type == 'video' or 'video' in content %}""",
)
assert QWEN3_OMNI_TEMPLATE.count("<|audio_pad|>") == 2 and "audio_count = namespace" in (
    QWEN3_OMNI_TEMPLATE
)

GEMMA3N_TEMPLATE = GEMMA3_TEMPLATE.replace(
    """            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}""",
    """            {%- if item['type'] == 'audio' -%}
                {{ '<audio_soft_token>' }}
            {%- elif item['type'] == 'image' -%}
                {{ '<image_soft_token>' }}""",
)
assert "<audio_soft_token>" in GEMMA3N_TEMPLATE

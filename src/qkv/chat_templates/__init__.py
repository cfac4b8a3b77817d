"""Chat templates: a conversation written as the text a chat model was trained on, and as token ids.

    import qkv
    from qkv.chat_templates import chat_prompt, chat_training_example, read_template_file

    bundle = qkv.load("models/smollm2-135m-instruct")              # its template comes with it
    prompt = chat_prompt(bundle, [{"role": "user", "content": "Hi"}])
    prompt.text, prompt.ids, prompt.stop_ids                      # what to generate from, and where to stop
    ids, mask = chat_training_example(bundle, conversation)       # mask: True on the assistant's tokens
    chat_prompt(bundle, messages, template=read_template_file("chat.jinja"))   # --chat-template FILE

- :mod:`~qkv.chat_templates.template`: rendering, exactly as transformers' ``apply_chat_template`` renders;
- :mod:`~qkv.chat_templates.source`: where a template comes from (a file, the model's own), or that there is none;
- :mod:`~qkv.chat_templates.messages`: checking a conversation (OpenAI's message format, text parts);
- :mod:`~qkv.chat_templates.prompt`: the prompt's text and ids, and the ids that end an assistant turn;
- :mod:`~qkv.chat_templates.training`: the ids and the assistant-only loss mask of a conversation, for fine-tuning.
"""

from qkv.chat_templates.messages import check_messages
from qkv.chat_templates.prompt import ChatPrompt, chat_prompt, end_of_turn_ids, render_messages
from qkv.chat_templates.source import hf_folder_template, read_template_file, template_of
from qkv.chat_templates.template import ChatTemplate, render
from qkv.chat_templates.training import chat_training_example

__all__ = [
    "ChatPrompt",
    "ChatTemplate",
    "chat_prompt",
    "chat_training_example",
    "check_messages",
    "end_of_turn_ids",
    "hf_folder_template",
    "read_template_file",
    "render",
    "render_messages",
    "template_of",
]

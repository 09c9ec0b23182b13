"""Channel connectors: terminal, Slack, email. They talk to the outside world and to the
agent only through `bot.channels.Channel` and the inbox; never to each other."""

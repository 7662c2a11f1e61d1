"""Rate limits (requests, tokens, in-flight places): in this replica's memory or shared through Redis.

Not to be confused with core's body limits (servlane_core.protocol.limits: request size and shape).
"""

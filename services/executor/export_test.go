package executor

// EncodeSpooled and DecodeSpooled expose the spool's encoding to the
// external tests.
var (
	EncodeSpooled = encodeSpooled
	DecodeSpooled = decodeSpooled
)

// DecodeReply exposes how the dispatcher reads a backend's reply.
var DecodeReply = decodeReply

// StartStage exposes how a stage's span is started.
var StartStage = startStage

package mcpbridge

import (
	"github.com/mandate-dev/mandate/internal/contract"
	"github.com/mandate-dev/mandate/internal/failure"
	"github.com/mandate-dev/mandate/internal/manifest"
)

// Names of the other services' contract the bridge relies on: stages it
// tells apart and values of their messages. Refusal codes are the table's
// (failure.Code*).
const (
	// stageRequest, stageSchema and stageDispatch are the executor's
	// stages of a call's attributes, its input and its result.
	stageRequest  = failure.StageRequest
	stageSchema   = failure.StageSchema
	stageDispatch = failure.StageDispatch
	// stageConfirmation is the stage of the confirm service's refusals.
	stageConfirmation = failure.StageConfirmation

	// channelMCPElicitation is the confirm service's decision channel of an
	// answer given through MCP elicitation.
	channelMCPElicitation = contract.ChannelMCPElicitation
	// approverPermissionHolder is the approver kind of a challenge that
	// someone holding a permission, not the requester, must decide.
	approverPermissionHolder = manifest.ApproverPermissionHolder

	// reviewCommand is the catalog's review, which the bridge narrates.
	reviewCommand = "ops.review"
	// opsReadPermission is what reading the manifest resource takes.
	opsReadPermission = "ops.read"
)

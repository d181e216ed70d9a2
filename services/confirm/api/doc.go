// Package api serves mandate.v1.ConfirmService over gRPC (and REST through
// the gateway): thin handlers that take the verified principal from the
// context, translate between mandate.v1 messages and the confirm domain, and
// map every error through internal/failure with the stage
// confirmation_check. Open and Redeem are for Mandate services relaying the
// requester (tenant, user and agent come from that principal, never from
// the request); Get and Await are for the requester and eligible
// approvers; Decide is for an eligible human.
package api

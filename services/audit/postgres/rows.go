package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mandate-dev/mandate/services/audit"
)

// sqlInsertRows writes rows passed as one array per column. Unlike COPY, an INSERT can share a
// pipeline (and so a round trip) with the statements around it. side_effects travels as the
// text of an array literal, because unnest would flatten a two-dimensional array; arguments
// as text, which json stores byte for byte.
var sqlInsertRows = func() string {
	var sel strings.Builder
	for i, c := range columns {
		if i > 0 {
			sel.WriteString(", ")
		}
		switch c {
		case "side_effects":
			sel.WriteString("u.side_effects::text[]")
		case "arguments":
			sel.WriteString("u.arguments::json")
		default:
			sel.WriteString("u." + c)
		}
	}
	var args strings.Builder
	for i := range columns {
		if i > 0 {
			args.WriteString(", ")
		}
		args.WriteString("$" + strconv.Itoa(i+1) + "::" + columnArrayTypes[i])
	}
	return "INSERT INTO audit.records (" + columnList + ")\n\tSELECT " + sel.String() +
		"\n\tFROM unnest(" + args.String() + ") AS u(" + columnList + ")"
}()

// columnArrayTypes are the array types sqlInsertRows receives the columns as, in the order of
// columns.
var columnArrayTypes = []string{
	"text[]", "bigint[]", "text[]", "text[]", "timestamptz[]", "text[]", "text[]", "text[]", "text[]",
	"boolean[]", "boolean[]", "text[]", "text[]", "text[]", "text[]", "text[]", "text[]",
	"text[]", "text[]", "text[]", "text[]", "text[]",
	"timestamptz[]", "text[]", "text[]", "text[]", "text[]", "text[]", "text[]",
	"text[]", "bigint[]", "text[]", "text[]", "bytea[]", "bytea[]",
}

// queueInsert queues the INSERT of rows into audit.records; nothing when there are none.
func queueInsert(b *pgx.Batch, rows []*audit.Stored) {
	n := len(rows)
	if n == 0 {
		return
	}
	// The text columns share one backing array, as do the nullable ones:
	// two allocations for a batch instead of one a column.
	strs, ptrs := make([]string, 23*n), make([]*string, 4*n)
	col := func(k int) []string { return strs[k*n : (k+1)*n : (k+1)*n] }
	ptrCol := func(k int) []*string { return ptrs[k*n : (k+1)*n : (k+1)*n] }
	var (
		tenant, inv, phase, channel, command, risk, sideEffects = col(0), col(1), col(2), col(3), col(4), col(5), col(6)
		subject, user, actor, agent, model, modelVersion        = col(7), col(8), col(9), col(10), col(11), col(12)
		conversation, session, outcome, stage, code, message    = col(13), col(14), col(15), col(16), col(17), col(18)
		argsDigest, resultDigest, traceID, manifestDigest       = col(19), col(20), col(21), col(22)
		challenge, approver, approvalChannel, args              = ptrCol(0), ptrCol(1), ptrCol(2), ptrCol(3)
		seq, duration                                           = make([]int64, n), make([]int64, n)
		at, decided                                             = make([]time.Time, n), make([]*time.Time, n)
		idempotent, reversible                                  = make([]bool, n), make([]bool, n)
		prevHash, hash                                          = make([][]byte, n), make([][]byte, n)
	)
	for i, r := range rows {
		tenant[i], seq[i], inv[i], phase[i], at[i] = r.Tenant, r.Seq, r.InvocationID, string(r.Phase), r.Time
		channel[i], command[i], risk[i], sideEffects[i] = string(r.Channel), r.Command, string(r.Risk), arrayLiteral(r.SideEffects)
		idempotent[i], reversible[i], subject[i], user[i], actor[i] = r.Idempotent, r.Reversible, r.Subject, r.UserID, string(r.ActorKind)
		agent[i], model[i], modelVersion[i], conversation[i], session[i] = r.AgentID, r.Model, r.ModelVersion, r.ConversationID, r.MCPSessionID
		if a := r.Approval; a != nil {
			challenge[i], approver[i], approvalChannel[i] = &a.ChallengeID, &a.Approver, &a.Channel
			if !a.DecidedAt.IsZero() {
				decided[i] = &a.DecidedAt
			}
		}
		outcome[i], stage[i], code[i], message[i] = string(r.Outcome), r.Stage, r.Code, r.Message
		if len(r.Arguments) > 0 {
			s := string(r.Arguments)
			args[i] = &s
		}
		argsDigest[i], resultDigest[i], duration[i], traceID[i], manifestDigest[i] = r.ArgumentsDigest, r.ResultDigest, int64(r.Duration), r.TraceID, r.ManifestDigest
		prevHash[i], hash[i] = r.PrevHash, r.Hash
	}
	b.Queue(sqlInsertRows,
		tenant, seq, inv, phase, at, channel, command, risk, sideEffects,
		idempotent, reversible, subject, user, actor, agent, model, modelVersion,
		conversation, session, challenge, approver, approvalChannel,
		decided, outcome, stage, code, message, args, argsDigest,
		resultDigest, duration, traceID, manifestDigest, prevHash, hash)
}

// arrayLiteral returns the text form of a PostgreSQL text[] holding elems: every element
// double-quoted, with backslash and double quote escaped.
func arrayLiteral(elems []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(e); j++ {
			if e[j] == '"' || e[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(e[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

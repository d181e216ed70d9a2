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
	"text[]",
}

// queueInsert queues the INSERT of rows into audit.records; nothing when there are none. typed
// says whether the connections describe statements before running them (see [typedParams]).
func queueInsert(b *pgx.Batch, rows []*audit.Stored, typed bool) {
	n := len(rows)
	if n == 0 {
		return
	}
	// The text columns share one backing array, as do the nullable ones:
	// two allocations for a batch instead of one a column.
	strs, ptrs := make([]string, 24*n), make([]*string, 5*n)
	col := func(k int) []string { return strs[k*n : (k+1)*n : (k+1)*n] }
	ptrCol := func(k int) []*string { return ptrs[k*n : (k+1)*n : (k+1)*n] }
	var (
		tenant, inv, phase, channel, command, risk, sideEffects = col(0), col(1), col(2), col(3), col(4), col(5), col(6)
		subject, user, actor, agent, model, modelVersion        = col(7), col(8), col(9), col(10), col(11), col(12)
		conversation, session, outcome, stage, code, message    = col(13), col(14), col(15), col(16), col(17), col(18)
		argsDigest, resultDigest, traceID, manifestDigest       = col(19), col(20), col(21), col(22)
		argsText                                                = col(23) // what args points at
		challenge, approver, approvalChannel, args              = ptrCol(0), ptrCol(1), ptrCol(2), ptrCol(3)
		ceiling                                                 = ptrCol(4)
		seq, duration                                           = make([]int64, n), make([]int64, n)
		at, decided                                             = make([]time.Time, n), make([]*time.Time, n)
		idempotent, reversible                                  = make([]bool, n), make([]bool, n)
		prevHash, hash                                          = make([][]byte, n), make([][]byte, n)
	)
	// The arguments and side-effect literals of every row are cut from one builder: one
	// allocation for the batch instead of one or two a row.
	var text strings.Builder
	text.Grow(textSize(rows))
	for i, r := range rows {
		tenant[i], seq[i], inv[i], phase[i], at[i] = r.Tenant, r.Seq, r.InvocationID, string(r.Phase), r.Time
		channel[i], command[i], risk[i] = string(r.Channel), r.Command, string(r.Risk)
		sideEffects[i] = appendArrayLiteral(&text, r.SideEffects)
		idempotent[i], reversible[i], subject[i], user[i], actor[i] = r.Idempotent, r.Reversible, r.Subject, r.UserID, string(r.ActorKind)
		agent[i], model[i], modelVersion[i], conversation[i], session[i] = r.AgentID, r.Model, r.ModelVersion, r.ConversationID, r.MCPSessionID
		if a := r.Approval; a != nil {
			challenge[i], approver[i], approvalChannel[i] = &a.ChallengeID, &a.Approver, &a.Channel
			if !a.DecidedAt.IsZero() {
				decided[i] = &a.DecidedAt
			}
			if a.TrustCeiling != "" {
				ceiling[i] = &a.TrustCeiling
			}
		}
		outcome[i], stage[i], code[i], message[i] = string(r.Outcome), r.Stage, r.Code, r.Message
		if len(r.Arguments) > 0 {
			from := text.Len()
			text.Write(r.Arguments)
			argsText[i] = text.String()[from:]
			args[i] = &argsText[i]
		}
		argsDigest[i], resultDigest[i], duration[i], traceID[i], manifestDigest[i] = r.ArgumentsDigest, r.ResultDigest, int64(r.Duration), r.TraceID, r.ManifestDigest
		prevHash[i], hash[i] = r.PrevHash, r.Hash
	}
	if !typed {
		b.Queue(sqlInsertRows,
			tenant, seq, inv, phase, at, channel, command, risk, sideEffects,
			idempotent, reversible, subject, user, actor, agent, model, modelVersion,
			conversation, session, challenge, approver, approvalChannel,
			decided, outcome, stage, code, message, args, argsDigest,
			resultDigest, duration, traceID, manifestDigest, prevHash, hash, ceiling)
		return
	}
	// The same columns as arrays that pgx encodes without boxing each value (see arrays.go):
	// all of them in one allocation, each passed by pointer, which boxes for free.
	c := &struct {
		tenant, inv, phase, channel, command, risk, sideEffects textArray
		subject, user, actor, agent, model, modelVersion        textArray
		conversation, session, outcome, stage, code, message    textArray
		argsDigest, resultDigest, traceID, manifestDigest       textArray
		challenge, approver, approvalChannel, args, ceiling     nullTextArray
		seq, duration                                           int8Array
		at                                                      timeArray
		decided                                                 nullTimeArray
		idempotent, reversible                                  boolArray
		prevHash, hash                                          byteaArray
	}{
		tenant: textArray{vals: tenant}, inv: textArray{vals: inv}, phase: textArray{vals: phase},
		channel: textArray{vals: channel}, command: textArray{vals: command}, risk: textArray{vals: risk},
		sideEffects: textArray{vals: sideEffects}, subject: textArray{vals: subject}, user: textArray{vals: user},
		actor: textArray{vals: actor}, agent: textArray{vals: agent}, model: textArray{vals: model},
		modelVersion: textArray{vals: modelVersion}, conversation: textArray{vals: conversation},
		session: textArray{vals: session}, outcome: textArray{vals: outcome}, stage: textArray{vals: stage},
		code: textArray{vals: code}, message: textArray{vals: message}, argsDigest: textArray{vals: argsDigest},
		resultDigest: textArray{vals: resultDigest}, traceID: textArray{vals: traceID},
		manifestDigest: textArray{vals: manifestDigest},
		challenge:      nullTextArray{vals: challenge}, approver: nullTextArray{vals: approver},
		approvalChannel: nullTextArray{vals: approvalChannel}, args: nullTextArray{vals: args},
		ceiling: nullTextArray{vals: ceiling},
		seq:     int8Array{vals: seq}, duration: int8Array{vals: duration},
		at: timeArray{vals: at}, decided: nullTimeArray{vals: decided},
		idempotent: boolArray{vals: idempotent}, reversible: boolArray{vals: reversible},
		prevHash: byteaArray{vals: prevHash}, hash: byteaArray{vals: hash},
	}
	b.Queue(sqlInsertRows,
		&c.tenant, &c.seq, &c.inv, &c.phase, &c.at, &c.channel, &c.command, &c.risk, &c.sideEffects,
		&c.idempotent, &c.reversible, &c.subject, &c.user, &c.actor, &c.agent, &c.model, &c.modelVersion,
		&c.conversation, &c.session, &c.challenge, &c.approver, &c.approvalChannel,
		&c.decided, &c.outcome, &c.stage, &c.code, &c.message, &c.args, &c.argsDigest,
		&c.resultDigest, &c.duration, &c.traceID, &c.manifestDigest, &c.prevHash, &c.hash, &c.ceiling)
}

// textSize is how many bytes queueInsert's builder takes for rows: their arguments and their
// side-effect literals (at most two bytes an element byte, with quotes, commas and braces).
func textSize(rows []*audit.Stored) int {
	n := 0
	for _, r := range rows {
		n += len(r.Arguments) + 2
		for _, e := range r.SideEffects {
			n += 2*len(e) + 3
		}
	}
	return n
}

// appendArrayLiteral writes the text form of a PostgreSQL text[] holding elems to b — every
// element double-quoted, with backslash and double quote escaped — and returns it. The string
// shares b's memory: a strings.Builder never changes what it has written.
func appendArrayLiteral(b *strings.Builder, elems []string) string {
	from := b.Len()
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
	return b.String()[from:]
}

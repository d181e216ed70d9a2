package failure

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	mandatev1 "github.com/mandate-dev/mandate/gen/mandate/v1"
)

// Domain is the google.rpc.ErrorInfo domain of every Mandate error.
const Domain = "mandate.dev"

// Violation is one broken input rule.
type Violation struct {
	Pointer string
	Rule    string
	Message string
}

// Error is a refusal or failure with a stage and a stable code.
type Error struct {
	Stage        string
	Code         string
	Message      string
	Retriable    bool
	Remedy       string
	Violations   []Violation
	InvocationID string
	ChallengeID  string
	ApprovalURL  string
	// GrantIn and GrantName say where a call carries the challenge id when
	// it is made again (CommandError.grant_in, grant_name);
	// ApproverPermission is who must approve under four eyes.
	GrantIn, GrantName, ApproverPermission string
	// RetryAfter, when positive, is how long the caller should wait before
	// it tries again (rate.limited): a google.rpc.RetryInfo detail on gRPC,
	// the Retry-After header and retry_after member on REST.
	RetryAfter time.Duration
	// Status overrides the gRPC code derived from Code.
	Status codes.Code
	cause  error
}

// New returns an error with a stage, a code and a client-safe message.
func New(stage, code, message string) *Error {
	return &Error{Stage: stage, Code: code, Message: message}
}

// Wrap is New with an internal cause kept for logs (errors.Unwrap) and
// never sent to clients.
func Wrap(stage, code, message string, cause error) *Error {
	return &Error{Stage: stage, Code: code, Message: message, cause: cause}
}

func (e *Error) Error() string {
	s := e.Code + ": " + e.Message
	if e.Stage != "" {
		s = e.Stage + ": " + s
	}
	return s
}

// Unwrap returns the internal cause.
func (e *Error) Unwrap() error { return e.cause }

// Is matches another *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t != nil && t.Code == e.Code
}

// GRPCStatus implements the interface status.FromError looks for.
func (e *Error) GRPCStatus() *status.Status {
	code := e.Status
	if code == codes.OK {
		code = GRPCCode(e.Code)
	}
	st := status.New(code, e.Message)
	ce := e.Proto()
	meta := map[string]string{}
	if e.Stage != "" {
		meta["stage"] = e.Stage
	}
	if e.InvocationID != "" {
		meta["invocation_id"] = e.InvocationID
	}
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: e.Code, Domain: Domain, Metadata: meta}, ce}
	if e.RetryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(e.RetryAfter)})
	}
	withDetails, err := st.WithDetails(details...)
	if err != nil {
		return st
	}
	return withDetails
}

// Proto is the error as the CommandError detail every channel carries.
func (e *Error) Proto() *mandatev1.CommandError {
	ce := &mandatev1.CommandError{
		Stage: e.Stage, Code: e.Code, Message: e.Message,
		Retriable: e.Retriable, Remedy: e.Remedy,
		InvocationId: e.InvocationID, ChallengeId: e.ChallengeID, ApprovalUrl: e.ApprovalURL,
		GrantIn: e.GrantIn, GrantName: e.GrantName, ApproverPermission: e.ApproverPermission,
	}
	for _, v := range e.Violations {
		ce.Violations = append(ce.Violations, &mandatev1.Violation{Pointer: v.Pointer, Rule: v.Rule, Message: v.Message})
	}
	return ce
}

// Internal is the error clients see for a fault whose details must stay
// on the server.
func Internal(stage string, cause error) *Error {
	return Wrap(stage, CodeInternalError, "internal error; the operator's logs have the details", cause)
}

// ToStatus converts any error to a gRPC status: Mandate errors and errors
// that carry a status keep them; context errors map to Canceled /
// DeadlineExceeded; everything else becomes a generic internal error.
func ToStatus(err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	var fe *Error
	if errors.As(err, &fe) {
		return fe.GRPCStatus()
	}
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &gs) {
		return gs.GRPCStatus()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.New(codes.Canceled, "request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return New("", CodeRequestDeadlineExceeded, "deadline exceeded").GRPCStatus()
	}
	return Internal("", err).GRPCStatus()
}

// FromStatus recovers the Mandate error a status carries, so that a client
// of a Mandate service holds the same *Error the service returned: stage,
// code, remedy and the rest from the mandate.v1.CommandError detail, or the
// code alone from a mandate.dev google.rpc.ErrorInfo. The gRPC code is kept
// in Status. ok is false for a status with neither detail (a transport
// failure, a context error), which callers pass on unchanged.
func FromStatus(st *status.Status) (*Error, bool) {
	if st == nil || st.Code() == codes.OK {
		return nil, false
	}
	var (
		fe    *Error
		info  *errdetails.ErrorInfo
		retry time.Duration
	)
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *mandatev1.CommandError:
			fe = &Error{
				Stage: x.GetStage(), Code: x.GetCode(), Message: x.GetMessage(),
				Retriable: x.GetRetriable(), Remedy: x.GetRemedy(),
				InvocationID: x.GetInvocationId(), ChallengeID: x.GetChallengeId(), ApprovalURL: x.GetApprovalUrl(),
				GrantIn: x.GetGrantIn(), GrantName: x.GetGrantName(), ApproverPermission: x.GetApproverPermission(),
			}
			for _, v := range x.GetViolations() {
				fe.Violations = append(fe.Violations, Violation{Pointer: v.GetPointer(), Rule: v.GetRule(), Message: v.GetMessage()})
			}
		case *errdetails.ErrorInfo:
			if x.GetDomain() == Domain {
				info = x
			}
		case *errdetails.RetryInfo:
			retry = x.GetRetryDelay().AsDuration()
		}
	}
	switch {
	case fe != nil && fe.Code != "":
	case info != nil && info.GetReason() != "":
		fe = &Error{Stage: info.GetMetadata()["stage"], Code: info.GetReason(), InvocationID: info.GetMetadata()["invocation_id"]}
	default:
		return nil, false
	}
	if fe.Message == "" {
		fe.Message = st.Message()
	}
	fe.RetryAfter = retry
	fe.Status = st.Code()
	return fe, true
}

// HTTPStatus maps a gRPC code to the HTTP status of a problem body.
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.FailedPrecondition:
		return http.StatusUnprocessableEntity
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// ProblemViolation is one entry of a problem body's `errors` member.
type ProblemViolation struct {
	Pointer string `json:"pointer"`
	Rule    string `json:"rule"`
	Detail  string `json:"detail"`
}

// ProblemBody is an RFC 9457 problem document with Mandate's extension
// members.
type ProblemBody struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail,omitempty"`
	Instance     string `json:"instance,omitempty"`
	Code         string `json:"code"`
	Stage        string `json:"stage,omitempty"`
	Retriable    bool   `json:"retriable"`
	Remedy       string `json:"remedy,omitempty"`
	InvocationID string `json:"invocation_id,omitempty"`
	ChallengeID  string `json:"challenge_id,omitempty"`
	ApprovalURL  string `json:"approval_url,omitempty"`
	// GrantIn, GrantName and ApproverPermission: see CommandError.
	GrantIn            string `json:"grant_in,omitempty"`
	GrantName          string `json:"grant_name,omitempty"`
	ApproverPermission string `json:"approver_permission,omitempty"`
	// RetryAfter is the whole seconds to wait before trying again (the
	// Retry-After header carries the same), 0 when the status says none.
	RetryAfter int                `json:"retry_after,omitempty"`
	Errors     []ProblemViolation `json:"errors,omitempty"`
}

// RetryAfterSeconds is d as the Retry-After header and the retry_after
// member state it: whole seconds, rounded up, at least 1.
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// CarriesCode reports whether a status carries a Mandate code (a
// mandate.v1.CommandError, or a google.rpc.ErrorInfo of Domain). Problem
// names a status without one after its gRPC code (FallbackCode).
func CarriesCode(st *status.Status) bool {
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *mandatev1.CommandError:
			return true
		case *errdetails.ErrorInfo:
			if x.GetDomain() == Domain {
				return true
			}
		}
	}
	return false
}

// FallbackCode is the problem code of a status that carries no Mandate
// code: "grpc." and the gRPC code in lower case, e.g. grpc.invalidargument.
func FallbackCode(c codes.Code) string {
	return "grpc." + strings.ToLower(c.String())
}

// Problem converts a status into a problem body.
func Problem(st *status.Status, instance string) ProblemBody {
	httpStatus := HTTPStatus(st.Code())
	p := ProblemBody{
		Type:     "about:blank",
		Title:    http.StatusText(httpStatus),
		Status:   httpStatus,
		Detail:   st.Message(),
		Instance: instance,
		Code:     FallbackCode(st.Code()),
	}
	if p.Title == "" {
		p.Title = "Client Closed Request"
	}
	if st.Code() == codes.Unavailable && !CarriesCode(st) {
		// A service that is draining, restarting or unreachable: the
		// transport's words mean nothing to a client, and the call is
		// worth retrying.
		spec := byCode[CodeServiceUnavailable]
		p.Code, p.Detail = CodeServiceUnavailable, "the service is unavailable (it may be restarting); retry later"
		p.Retriable, p.Remedy = spec.Retriable, spec.Remedy
	}
	for _, d := range st.Details() {
		switch x := d.(type) {
		case *errdetails.ErrorInfo:
			if x.GetDomain() == Domain {
				p.Code = x.GetReason()
			}
		case *mandatev1.CommandError:
			p.Code, p.Stage, p.Retriable, p.Remedy = x.GetCode(), x.GetStage(), x.GetRetriable(), x.GetRemedy()
			p.InvocationID, p.ChallengeID, p.ApprovalURL = x.GetInvocationId(), x.GetChallengeId(), x.GetApprovalUrl()
			p.GrantIn, p.GrantName, p.ApproverPermission = x.GetGrantIn(), x.GetGrantName(), x.GetApproverPermission()
			if x.GetMessage() != "" {
				p.Detail = x.GetMessage()
			}
			for _, v := range x.GetViolations() {
				p.Errors = append(p.Errors, ProblemViolation{Pointer: v.GetPointer(), Rule: v.GetRule(), Detail: v.GetMessage()})
			}
		case *errdetails.RetryInfo:
			if d := x.GetRetryDelay().AsDuration(); d > 0 {
				p.RetryAfter = RetryAfterSeconds(d)
			}
		case *errdetails.BadRequest:
			for _, fv := range x.GetFieldViolations() {
				p.Errors = append(p.Errors, ProblemViolation{Pointer: "/" + strings.ReplaceAll(fv.GetField(), ".", "/"), Rule: fv.GetReason(), Detail: fv.GetDescription()})
			}
		}
	}
	return p
}

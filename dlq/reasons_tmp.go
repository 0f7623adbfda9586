package dlq

// Dead-letter reasons (temporary: replaced by the dlq branch's list).
const (
	ReasonAppUnavailable = "app-unavailable"
	ReasonNotAttempted   = "not-attempted"
)

// Package admincli is `sluice admin`, the command-line client of the admin API
// (docs/architecture.md, "Control plane"): one cobra command per resource, speaking the API
// through control/adminclient and printing its answers as tables or as the server's JSON.
// The binary adds it to its commands; its exit codes are ExitCode's.
package admincli

import (
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/control/adminclient"
)

// The admin commands speak the admin API through its Go client, so that the token handling
// (never printed) and the error rendering live once.
type (
	adminClient = adminclient.Client
	answer      = adminclient.Answer
	request     = adminclient.Request
	changeFlags = adminclient.Change
)

// adminPath joins escaped path segments under /admin/v1/.
var adminPath = adminclient.Path

// adminExitCode is the exit code of an error answer's status.
func adminExitCode(status int) int {
	switch status {
	case http.StatusNotFound:
		return exitNotFound
	case http.StatusConflict, http.StatusPreconditionFailed:
		return exitConflict
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests:
		// The admin API answers 429 only to an address with too many failed authentications.
		return exitAuth
	}
	return exitGeneral
}

// ExitError is an error with the exit code the command ends with.
type ExitError struct {
	Code int
	Msg  string
}

func (e ExitError) Error() string { return e.Msg }

// ExitCode is the exit code of an admin command's error: an ExitError's own, an admin API
// error's by its status, else 1.
func ExitCode(err error) int {
	var ee ExitError
	var ae *adminclient.Error
	switch {
	case errors.As(err, &ee):
		return ee.Code
	case errors.As(err, &ae):
		return adminExitCode(ae.Status)
	}
	return exitGeneral
}

package main

import (
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

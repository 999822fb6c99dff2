-- Argo CD health check for agentrun.dev/AgentRun.
--
-- Install it in the argocd-cm ConfigMap under
--   resource.customizations.health.agentrun.dev_AgentRun
-- (see README.md, "GitOps (Argo CD, Flux)"). Argo CD calls it with the live object as `obj`.
--
--   Pending, Running, AwaitingApproval   -> Progressing
--   Succeeded                            -> Healthy
--   Failed                               -> Degraded
--   Cancelled                            -> Degraded  (the run ended without its result and never
--                                           resumes, so it is not Suspended; the message says it
--                                           was cancelled)
--   no status yet, or a spec change the operator has not observed -> Progressing
--
-- A finished run is final: later spec changes (cancel, ttlSecondsAfterFinished) do not make it
-- Progressing again even before the operator records the new generation.

local hs = {}

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function describe(status, fallback)
  local parts = {}
  if status.phase ~= nil then
    table.insert(parts, status.phase)
  end
  if status.stopReason ~= nil then
    table.insert(parts, "(" .. status.stopReason .. ")")
  end
  local succeeded = condition(status, "Succeeded")
  local message = (succeeded ~= nil and succeeded.message) or fallback
  local text = table.concat(parts, " ")
  if message ~= nil and message ~= "" then
    text = text .. ": " .. message
  end
  return text
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to pick up the run"
  return hs
end

local status = obj.status
local phase = status.phase

if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = describe(status, "the run succeeded")
  return hs
end
if phase == "Failed" then
  hs.status = "Degraded"
  hs.message = describe(status, "the run failed")
  return hs
end
if phase == "Cancelled" then
  hs.status = "Degraded"
  hs.message = describe(status, "the run was cancelled")
  return hs
end

local generation = obj.metadata and obj.metadata.generation
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

if phase == "Pending" or phase == "Running" or phase == "AwaitingApproval" then
  hs.status = "Progressing"
  local reconciling = condition(status, "Reconciling")
  hs.message = describe(status, reconciling ~= nil and reconciling.message or nil)
  return hs
end

hs.status = "Unknown"
hs.message = "Unknown phase " .. tostring(phase)
return hs

-- Argo CD health of a servlane.dev AIFeature (gopher-lua, Lua 5.1).
-- Healthy: Stable or Split with the current generation observed and its models Ready or scaled to zero.
-- Progressing: not yet observed, Pending, a model that receives traffic not Ready (Ready=False for a reason
-- other than ScaledToZero), or a canary running.
-- Suspended: the rollout is paused. Degraded: the canary was rolled back.
local hs = {status = "Progressing", message = "Waiting for the operator to report status"}

local function condition_message(status, kind)
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == kind and c.message ~= nil and c.message ~= "" then
        return c.message
      end
    end
  end
  return nil
end

-- The operator's Ready condition: False while a model that receives traffic is not Ready, except for models
-- at rest at zero replicas (reason ScaledToZero: the next request wakes them), which are as healthy as a
-- Deployment scaled to 0.
local function not_ready(status)
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == "Ready" and c.status ~= "True" and c.reason ~= "ScaledToZero" then
        return true
      end
    end
  end
  return false
end

local status = obj.status
if status == nil or status.phase == nil then
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.message = "The operator has not yet observed generation " .. tostring(generation)
  return hs
end

local phase = status.phase
local canary = "canary " .. tostring(status.canaryModel) .. " at " .. tostring(status.canaryWeight or 0) .. "%"
if (phase == "Stable" or phase == "Split") and not_ready(status) then
  hs.message = condition_message(status, "Ready") or "Waiting for its models to be Ready"
elseif phase == "Stable" then
  hs.status = "Healthy"
  hs.message = "Serving " .. tostring(status.stableModel)
elseif phase == "Split" then
  hs.status = "Healthy"
  hs.message = condition_message(status, "Ready") or "Serving a fixed traffic split"
elseif phase == "Progressing" then
  hs.message = "Rolling out " .. canary
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "Rollout paused with " .. canary
elseif phase == "RolledBack" then
  hs.status = "Degraded"
  hs.message = "Canary " .. tostring(status.rolledBackModel) .. " was rolled back; still serving "
    .. tostring(status.stableModel) .. ". " .. (condition_message(status, "Degraded") or "")
else
  hs.message = phase .. ": " .. (condition_message(status, "Progressing") or "waiting for a ready model")
end
return hs
